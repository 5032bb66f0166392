# A workload image that already has tenure (the chart's `tenure.inject=false`): Debian's
# static busybox and its applet links with the static musl tenure at /usr/local/bin/tenure,
# on an empty base — client-go's candidate image (clientgo-candidate.Dockerfile) with tenure
# in its place, for tests/node_peers.rs's install row. Built offline by `e2e/node/images.sh --peers`.
FROM scratch
COPY bin /bin
COPY tenure /usr/local/bin/tenure
USER 65532:65532
ENTRYPOINT ["/bin/sh"]
