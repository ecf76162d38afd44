module kiln.dev/e2e/cluster/probe

go 1.24.0
