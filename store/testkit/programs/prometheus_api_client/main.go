// Calls a store's Prometheus-compatible read API (/prometheus/api/v1/...)
// through Prometheus' own Go client, github.com/prometheus/client_golang's
// api/prometheus/v1, as Prometheus tooling would: form POSTs for query,
// query_range, labels and series (the client's default, with its GET
// fallback), a GET for label values. Prints one JSON object of what each
// call answered, summed where the test compares sums.
//
// Usage: prometheus_api_client STORE_URL TOKEN START_S END_S STEP QUERY [SERIES_MATCH...]
//
// A call that fails stops the run: the program prints
// {"failed_call","error_type","error","requests"} (error_type is the client's
// *v1.Error Type, so a test can tell an API refusal from a broken
// client) and exits 1.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/api"
	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

// series is one series of a range or instant answer, its points summed.
type series struct {
	Metric map[string]string `json:"metric"`
	Sum    float64           `json:"sum"`
	Points int               `json:"points"`
}

// answers is what the calls returned.
type answers struct {
	BuildinfoVersion string              `json:"buildinfo_version"`
	LabelNames       []string            `json:"label_names"`
	MetricNames      []string            `json:"metric_names"`
	Series           []map[string]string `json:"series"`
	Range            []series            `json:"range"`
	RangeTotal       float64             `json:"range_total"`
	Instant          []series            `json:"instant"`
	InstantTotal     float64             `json:"instant_total"`
	Warnings         []string            `json:"warnings"`
	Requests         []string            `json:"requests"`
}

// failure is what a failed call printed instead of answers.
type failure struct {
	FailedCall string   `json:"failed_call"`
	ErrorType  string   `json:"error_type"`
	Error      string   `json:"error"`
	Requests   []string `json:"requests"`
}

// bearer adds the store's read token, as an operator's
// authorization.credentials would in a Prometheus-compatible tool, and
// notes every request: the client falls back from POST to GET on a 405,
// so only this log shows whether the store took the form POST.
type bearer struct {
	token    string
	next     http.RoundTripper
	requests *[]string
}

func (b bearer) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set("Authorization", "Bearer "+b.token)
	resp, err := b.next.RoundTrip(req)
	status := "no answer"
	if resp != nil {
		status = strconv.Itoa(resp.StatusCode)
	}
	*b.requests = append(*b.requests, req.Method+" "+req.URL.Path+" "+status)
	return resp, err
}

// callError names the call that failed.
type callError struct {
	call string
	err  error
}

func (e *callError) Error() string { return e.call + ": " + e.err.Error() }

// Unwrap lets errors.As reach the client's *v1.Error.
func (e *callError) Unwrap() error { return e.err }

func labelMap(set model.LabelSet) map[string]string {
	out := make(map[string]string, len(set))
	for name, value := range set {
		out[string(name)] = string(value)
	}
	return out
}

func run(client v1.API, start, end time.Time, step time.Duration, query string, matches []string) (*answers, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out := &answers{Warnings: []string{}}

	build, err := client.Buildinfo(ctx)
	if err != nil {
		return nil, &callError{"buildinfo", err}
	}
	out.BuildinfoVersion = build.Version

	names, warnings, _, err := client.LabelNames(ctx, nil, start, end)
	if err != nil {
		return nil, &callError{"label_names", err}
	}
	out.Warnings = append(out.Warnings, warnings...)
	for _, name := range names {
		out.LabelNames = append(out.LabelNames, string(name))
	}

	values, warnings, _, err := client.LabelValues(ctx, model.MetricNameLabel, nil, start, end)
	if err != nil {
		return nil, &callError{"label_values", err}
	}
	out.Warnings = append(out.Warnings, warnings...)
	for _, value := range values {
		out.MetricNames = append(out.MetricNames, string(value))
	}

	if len(matches) > 0 {
		sets, warnings, _, err := client.Series(ctx, matches, start, end)
		if err != nil {
			return nil, &callError{"series", err}
		}
		out.Warnings = append(out.Warnings, warnings...)
		for _, set := range sets {
			out.Series = append(out.Series, labelMap(set))
		}
	}

	ranged, warnings, _, err := client.QueryRange(ctx, query, v1.Range{Start: start, End: end, Step: step})
	if err != nil {
		return nil, &callError{"query_range", err}
	}
	out.Warnings = append(out.Warnings, warnings...)
	matrix, ok := ranged.(model.Matrix)
	if !ok {
		return nil, &callError{"query_range", fmt.Errorf("a %s, not a matrix", ranged.Type())}
	}
	for _, stream := range matrix {
		s := series{Metric: labelMap(model.LabelSet(stream.Metric)), Points: len(stream.Values)}
		for _, point := range stream.Values {
			s.Sum += float64(point.Value)
		}
		out.Range = append(out.Range, s)
		out.RangeTotal += s.Sum
	}

	instant, warnings, _, err := client.Query(ctx, query, end)
	if err != nil {
		return nil, &callError{"query", err}
	}
	out.Warnings = append(out.Warnings, warnings...)
	switch v := instant.(type) {
	case model.Vector:
		for _, sample := range v {
			s := series{Metric: labelMap(model.LabelSet(sample.Metric)), Sum: float64(sample.Value), Points: 1}
			out.Instant = append(out.Instant, s)
			out.InstantTotal += s.Sum
		}
	case *model.Scalar:
		out.Instant = append(out.Instant, series{Metric: map[string]string{}, Sum: float64(v.Value), Points: 1})
		out.InstantTotal += float64(v.Value)
	default:
		return nil, &callError{"query", fmt.Errorf("a %s, not a vector or scalar", instant.Type())}
	}
	return out, nil
}

func fail(f failure) {
	fmt.Fprintf(os.Stderr, "prometheus_api_client: %s: %s (%s)\n", f.FailedCall, f.Error, f.ErrorType)
	_ = json.NewEncoder(os.Stdout).Encode(f)
	os.Exit(1)
}

func seconds(text string) time.Time {
	s, err := strconv.ParseInt(text, 10, 64)
	if err != nil {
		fail(failure{FailedCall: "arguments", Error: err.Error()})
	}
	return time.Unix(s, 0)
}

func main() {
	if len(os.Args) < 7 {
		fail(failure{FailedCall: "arguments", Error: "usage: prometheus_api_client STORE_URL TOKEN START_S END_S STEP QUERY [SERIES_MATCH...]"})
	}
	step, err := time.ParseDuration(os.Args[5])
	if err != nil {
		fail(failure{FailedCall: "arguments", Error: err.Error()})
	}
	var requests []string
	client, err := api.NewClient(api.Config{
		Address:      os.Args[1],
		RoundTripper: bearer{token: os.Args[2], next: api.DefaultRoundTripper, requests: &requests},
	})
	if err != nil {
		fail(failure{FailedCall: "new_client", Error: err.Error()})
	}
	out, err := run(v1.NewAPI(client), seconds(os.Args[3]), seconds(os.Args[4]), step, os.Args[6], os.Args[7:])
	if err != nil {
		f := failure{Error: err.Error()}
		var call *callError
		if errors.As(err, &call) {
			f.FailedCall = call.call
		}
		// The client's own error type: bad_data for a refusal in
		// Prometheus' shape, client_error or bad_response when the store
		// answered in a shape the client does not read.
		var apiErr *v1.Error
		if errors.As(err, &apiErr) {
			f.ErrorType = string(apiErr.Type)
		}
		f.Requests = requests
		fail(f)
	}
	out.Requests = requests
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fail(failure{FailedCall: "output", Error: err.Error()})
	}
}
