"""The local clusters: the emulator (fast, embedded) and the real control plane, each with GPU nodes and a
node agent that runs model servers.

The emulator:
- `apiserver.SandboxApiServer`: an aiohttp application (discovery, resources, injected faults) over `store.Store`,
  which implements kube-apiserver's semantics; `apiserver.ApiServerSite` serves it on 127.0.0.1. Built-ins are
  validated with the Kubernetes 1.37 schemas of kubernetes-validate (`validation`), custom resources with
  `infer_ctl.kube.crd`. Held against the real kube-apiserver by tests/realcluster/test_emulator_agrees.py.
- `scheduler` + `allocator`: kube-scheduler for what the project uses, with DRA allocation on top of the
  placement engine's device inventory and CEL.
- `runtime.Sandbox`: all of it on one event loop; `infer-ctl sandbox up` (`infer_ctl.cli.sandbox`).

The real control plane:
- `localcluster.LocalCluster`: etcd, kube-apiserver, kube-scheduler and kube-controller-manager 1.37, built
  from their Go modules (`kubebin/`, `scripts/kube-binaries.sh`); `kueue.LocalKueue`: Kueue's manager beside it.
- `kubeside.KubeSide`: the node agent and router against any API server; `kubesandbox`: both together
  (`infer-ctl sandbox up --control-plane kube`).

Shared by both:
- `cluster`: cluster files -> Nodes, ResourceSlices and DeviceClasses as NVIDIA's DRA driver publishes them.
- `view`: how the node agent and router see a cluster (`StoreView` in process, `KubeView` over HTTP).
- `nodeagent` + `modelserver`: a model-server process per bound Pod; `router`: a front door per
  InferenceService.
- `testing`: a threaded API server and object builders for tests; `benchmarks`: the figures.
"""
