"""``runtime-proxy play``: act as kubelet for one Pod manifest."""
