# examples/kube_controller.rs as a pod image for the node tests (tests/node_peers.rs): the
# static musl build of the example on an empty base, with CA certificates and an /etc/passwd
# naming uid 65532 (nonroot), run as 65532 — the same layout as the repository's Dockerfile
# gives tenure. Built offline by `e2e/node/images.sh --peers`.
#
# No STOPSIGNAL: the example stops on SIGTERM (what a pod deletion sends) as on Ctrl-C. Before
# it did, as a container's PID 1 without a SIGTERM handler it ignored the signal and led on
# until the kubelet's SIGKILL after the grace period, and the successor waited for the Lease
# too: tests/node_peers.rs measured a leader pod delete -> the successor's first stamp at
# 42.7 s then (30 s grace + the rest of the 15 s lease), 0.13 s with the handler.
FROM scratch
COPY kube_controller /usr/local/bin/kube_controller
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY passwd group /etc/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/kube_controller"]
