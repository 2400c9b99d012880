"""The openb placement benchmark (Alibaba GPU trace, the FGD paper's protocol) and its reference policies.

`runner.run(...)` / `infer-ctl bench placement` convert the trace's nodes and pods into Node, ResourceSlice and
ResourceClaim objects and place them with infer-ctl's engine (`infer_ctl.place`), under the reference policies
(`policies.py`: random, dotprod, clustering, packing, bestfit, fgd) or infer-ctl's own profile.
"""
