# client-go's leader election in a pod, the peer of the chart's release in tests/node_peers.rs:
# e2e/kube-testenv/cmd/clientgo-candidate (static Go) with Debian's static busybox and its
# applet links (the pod's shell runs a writer while the candidate leads), on an empty base.
# Built offline by `e2e/node/images.sh --peers`.
FROM scratch
COPY bin /bin
COPY clientgo-candidate /usr/local/bin/clientgo-candidate
USER 65532:65532
ENTRYPOINT ["/bin/sh"]
