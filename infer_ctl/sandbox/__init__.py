"""The local sandbox cluster: an API server (kmock-based), GPU nodes with DRA, a scheduler, a node agent.

- `apiserver.SandboxApiServer`: a `kmock.KubernetesScaffold` subclass (kmock's HTTP server, discovery and
  fault-injection reactions) over `store.Store`, which implements kube-apiserver's semantics (see its module
  docstring for why kmock's own object store is not used). Built-ins are validated with the Kubernetes 1.37
  schemas of kubernetes-validate (`validation`), custom resources with `infer_ctl.kube.crd`.
- `cluster`: cluster files -> Nodes, ResourceSlices and DeviceClasses as NVIDIA's DRA driver publishes them.
- `scheduler` + `allocator`: kube-scheduler for what the project uses, with DRA allocation on top of the
  placement engine's device inventory and CEL.
- `nodeagent` + `modelserver`: a model-server process per bound Pod; `router`: a front door per
  InferenceService.
- `runtime.Sandbox`: all of it on one event loop; `infer-ctl sandbox up` (`infer_ctl.cli.sandbox`).
- `testing`: a threaded API server and object builders for tests; `benchmarks`: the figures.
"""
