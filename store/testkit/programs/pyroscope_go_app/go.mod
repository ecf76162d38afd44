module kiln.invalid/testkit/pyroscope_go_app

go 1.22

require github.com/grafana/pyroscope-go v1.2.7

require (
	github.com/grafana/pyroscope-go/godeltaprof v0.1.9 // indirect
	github.com/klauspost/compress v1.17.8 // indirect
)
