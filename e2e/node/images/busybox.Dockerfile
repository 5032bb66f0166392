# The chart's default workload image (busybox:1.37) for the node tests: Debian's static
# busybox with its applet links, on an empty base. Built offline by e2e/node/images.sh.
FROM scratch
COPY bin /bin
ENTRYPOINT ["/bin/sh"]
