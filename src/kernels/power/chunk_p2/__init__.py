"""The p=2 state kernels of the chunked form: Triton (kernels.py, every GPU and the interpreter) and Gluon
(gluon_outer.py, gluon_rows.py: Hopper, Triton >= 3.6), their tables and switches (config.py)."""
