# The pod sandbox image (registry.k8s.io/pause:3.10 in the node's containerd configuration):
# e2e/node/cmd/pause, static, on an empty base. Built offline by e2e/node/images.sh.
FROM scratch
COPY pause /pause
USER 65535:65535
ENTRYPOINT ["/pause"]
