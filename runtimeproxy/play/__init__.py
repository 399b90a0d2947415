"""``runtime-proxy play``: act as kubelet for one Pod manifest (command), sending the requests
kubelet would (runtimeproxy.kubelet_model) to a CRI runtime (runner) through grpcio
(cri_client).

May import the standard library, third-party libraries, runtimeproxy.api, hookapi, common and
kubelet_model; never the relay, the hook layer, runtimeproxy.proxy or runtime-hooks.
"""
