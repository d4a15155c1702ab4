"""Run a call's plan (plan.py) on the Triton forms: the attention form or the chunked form, with the plan's launcher,
chunk and family (the reference's plans run in interface.py). Nothing here decides a route: the routing table is
plan.make_plan's (and docs/kernels.md's)."""
from __future__ import annotations

from .autograd import attention_form, chunked_form
from .plan import Plan


def run(plan: Plan, q, k, v, log_g, *, scale, norm, initial_state, return_state):
    """power_attention's result for `plan` (make_plan of these inputs; form "attention" or "chunked")."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if plan.form == "attention":
        return attention_form(q, k, v, log_g, p=plan.p, scale=scale, norm=norm, plan=plan)
    if plan.form != "chunked":
        raise ValueError(f"plan.form={plan.form!r}: run takes the attention or the chunked form")
    return chunked_form(q, k, v, log_g, p=plan.p, scale=scale, norm=norm, initial_state=initial_state,
                        return_state=return_state, plan=plan)
