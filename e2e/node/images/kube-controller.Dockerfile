# examples/kube_controller.rs as a pod image for the node tests (tests/node_peers.rs): the
# static musl build of the example on an empty base, with CA certificates and an /etc/passwd
# naming uid 65532 (nonroot), run as 65532 — the same layout as the repository's Dockerfile
# gives tenure. Built offline by `e2e/node/images.sh --peers`.
#
# STOPSIGNAL SIGINT: the example stops (and releases its lease at once) on Ctrl-C only
# (tokio::signal::ctrl_c). As a container's PID 1 it has no SIGTERM handler, so the kernel
# drops the SIGTERM a pod deletion sends, and the pod would lead on until the kubelet's
# SIGKILL after terminationGracePeriodSeconds, and the successor would wait for the Lease to
# expire too; containerd sends the image's stop signal instead. tests/node_peers.rs measured
# a leader pod delete -> the successor's first stamp: 42.7 s without this line (30 s grace +
# the rest of the 15 s lease), 0.13 s with it.
FROM scratch
COPY kube_controller /usr/local/bin/kube_controller
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY passwd group /etc/
USER 65532:65532
STOPSIGNAL SIGINT
ENTRYPOINT ["/usr/local/bin/kube_controller"]
