"""longctx: long-context language-model research framework (power attention, ICL metrics)."""
