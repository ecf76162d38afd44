module kiln.invalid/testkit/prometheus_api_client

go 1.26.0

require (
	github.com/prometheus/client_golang v1.25.0
	github.com/prometheus/common v0.72.1
)

require (
	github.com/json-iterator/go v1.1.12 // indirect
	github.com/modern-go/concurrent v0.0.0-20180306012644-bacd9c7ef1dd // indirect
	github.com/modern-go/reflect2 v1.0.3-0.20250322232337-35a7c28c31ee // indirect
	github.com/prometheus/client_model v0.6.3 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
