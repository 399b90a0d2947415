"""What kubelet makes of a Pod manifest, computed without I/O: the manifest read and checked as
the API server would (manifest), requests and limits (pod_resources), the Kubernetes QoS class
(kube_qos), the CRI resource values (cri_resources), and the RunPodSandbox / CreateContainer
requests kubelet sends (pod_plan), the manifest read with the ConfigMaps and node facts it
needs (pod_input). ``runtime-proxy play`` and ``demo`` send those requests;
``runtime-hooks explain`` runs the plugins on them.

May import the standard library, third-party libraries (kubernetes), runtimeproxy.api and
runtimeproxy.hookapi.
"""
