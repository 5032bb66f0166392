module tenure/e2e/launchkit

go 1.26.0
