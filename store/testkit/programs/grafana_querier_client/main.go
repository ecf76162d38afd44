// Calls every querier.v1 method of a store through Grafana's own Go client
// (github.com/grafana/pyroscope/api, its querierv1connect package), once
// in Connect's binary protobuf codec and once in its JSON codec, and
// prints what each answered as one JSON object per codec, for the test to
// compare with Kiln's own /api/v1.
//
// Usage: grafana_querier_client STORE_URL PROFILE_TYPE LABEL_SELECTOR START_MS END_MS SPAN_ID
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"

	"connectrpc.com/connect"
	querierv1 "github.com/grafana/pyroscope/api/gen/proto/go/querier/v1"
	"github.com/grafana/pyroscope/api/gen/proto/go/querier/v1/querierv1connect"
	typesv1 "github.com/grafana/pyroscope/api/gen/proto/go/types/v1"
)

// answers is what one codec's calls returned.
type answers struct {
	Codec            string   `json:"codec"`
	ProfileTypes     []string `json:"profile_types"`
	LabelNames       []string `json:"label_names"`
	ServiceNames     []string `json:"service_names"`
	Series           int      `json:"series"`
	StacktracesTotal int64    `json:"stacktraces_total"`
	StacktracesNames []string `json:"stacktraces_names"`
	SpanTotal        int64    `json:"span_total"`
	SpanNames        []string `json:"span_names"`
	ProfileTotal     int64    `json:"profile_total"`
	ProfileFunctions int      `json:"profile_functions"`
	SeriesTotal      float64  `json:"series_total"`
	// Exemplars: how many points carried one, whether any outweighed its
	// point, and the heaviest one opened by its id in both merge calls.
	Exemplars                int    `json:"exemplars"`
	ExemplarOverPoint        bool   `json:"exemplar_over_point"`
	ExemplarID               string `json:"exemplar_id"`
	ExemplarValue            int64  `json:"exemplar_value"`
	ExemplarLabels           int    `json:"exemplar_labels"`
	ExemplarProfileTotal     int64  `json:"exemplar_profile_total"`
	ExemplarStacktracesTotal int64  `json:"exemplar_stacktraces_total"`
	DiffLeftTicks            int64  `json:"diff_left_ticks"`
	DiffRightTicks           int64  `json:"diff_right_ticks"`
	DataIngested             bool   `json:"data_ingested"`
	OldestProfileTime        int64  `json:"oldest_profile_time"`
	NewestProfileTime        int64  `json:"newest_profile_time"`
	SelectHeatmap            string `json:"select_heatmap"`
	AnalyzeQuery             string `json:"analyze_query"`
}

func call(codec string, client querierv1connect.QuerierServiceClient, profileType, selector string, start, end int64, span string) (*answers, error) {
	ctx := context.Background()
	out := &answers{Codec: codec}

	types, err := client.ProfileTypes(ctx, connect.NewRequest(&querierv1.ProfileTypesRequest{Start: start, End: end}))
	if err != nil {
		return nil, fmt.Errorf("ProfileTypes: %w", err)
	}
	for _, t := range types.Msg.ProfileTypes {
		out.ProfileTypes = append(out.ProfileTypes, t.ID)
	}
	names, err := client.LabelNames(ctx, connect.NewRequest(&typesv1.LabelNamesRequest{Start: start, End: end}))
	if err != nil {
		return nil, fmt.Errorf("LabelNames: %w", err)
	}
	out.LabelNames = names.Msg.Names
	values, err := client.LabelValues(ctx, connect.NewRequest(&typesv1.LabelValuesRequest{Name: "service_name", Start: start, End: end}))
	if err != nil {
		return nil, fmt.Errorf("LabelValues: %w", err)
	}
	out.ServiceNames = values.Msg.Names
	series, err := client.Series(ctx, connect.NewRequest(&querierv1.SeriesRequest{Matchers: []string{selector}, Start: start, End: end}))
	if err != nil {
		return nil, fmt.Errorf("Series: %w", err)
	}
	out.Series = len(series.Msg.LabelsSet)

	merged, err := client.SelectMergeStacktraces(ctx, connect.NewRequest(&querierv1.SelectMergeStacktracesRequest{
		ProfileTypeID: profileType, LabelSelector: selector, Start: start, End: end,
		Format: querierv1.ProfileFormat_PROFILE_FORMAT_FLAMEGRAPH,
	}))
	if err != nil {
		return nil, fmt.Errorf("SelectMergeStacktraces: %w", err)
	}
	out.StacktracesTotal = merged.Msg.Flamegraph.GetTotal()
	out.StacktracesNames = merged.Msg.Flamegraph.GetNames()

	spanProfile, err := client.SelectMergeSpanProfile(ctx, connect.NewRequest(&querierv1.SelectMergeSpanProfileRequest{
		ProfileTypeID: profileType, LabelSelector: selector, SpanSelector: []string{span}, Start: start, End: end,
	}))
	if err != nil {
		return nil, fmt.Errorf("SelectMergeSpanProfile: %w", err)
	}
	out.SpanTotal = spanProfile.Msg.Flamegraph.GetTotal()
	out.SpanNames = spanProfile.Msg.Flamegraph.GetNames()

	profile, err := client.SelectMergeProfile(ctx, connect.NewRequest(&querierv1.SelectMergeProfileRequest{
		ProfileTypeID: profileType, LabelSelector: selector, Start: start, End: end,
	}))
	if err != nil {
		return nil, fmt.Errorf("SelectMergeProfile: %w", err)
	}
	for _, sample := range profile.Msg.Sample {
		if len(sample.Value) > 0 {
			out.ProfileTotal += sample.Value[0]
		}
	}
	out.ProfileFunctions = len(profile.Msg.Function)

	step := float64(end-start) / 1000 / 10
	points, err := client.SelectSeries(ctx, connect.NewRequest(&querierv1.SelectSeriesRequest{
		ProfileTypeID: profileType, LabelSelector: selector, Start: start, End: end, Step: step,
		ExemplarType: typesv1.ExemplarType_EXEMPLAR_TYPE_INDIVIDUAL,
	}))
	if err != nil {
		return nil, fmt.Errorf("SelectSeries: %w", err)
	}
	var heaviest *typesv1.Exemplar
	for _, s := range points.Msg.Series {
		for _, p := range s.Points {
			out.SeriesTotal += p.Value
			for _, e := range p.Exemplars {
				out.Exemplars++
				if float64(e.Value) > p.Value {
					out.ExemplarOverPoint = true
				}
				if heaviest == nil || e.Value > heaviest.Value {
					heaviest = e
				}
			}
		}
	}
	if heaviest != nil {
		out.ExemplarID = heaviest.ProfileId
		out.ExemplarValue = heaviest.Value
		out.ExemplarLabels = len(heaviest.Labels)
		one, err := client.SelectMergeProfile(ctx, connect.NewRequest(&querierv1.SelectMergeProfileRequest{
			ProfileTypeID: profileType, LabelSelector: selector, Start: start, End: end,
			ProfileIdSelector: []string{heaviest.ProfileId},
		}))
		if err != nil {
			return nil, fmt.Errorf("SelectMergeProfile by profile id: %w", err)
		}
		for _, sample := range one.Msg.Sample {
			if len(sample.Value) > 0 {
				out.ExemplarProfileTotal += sample.Value[0]
			}
		}
		graph, err := client.SelectMergeStacktraces(ctx, connect.NewRequest(&querierv1.SelectMergeStacktracesRequest{
			ProfileTypeID: profileType, LabelSelector: selector, Start: start, End: end,
			ProfileIdSelector: []string{heaviest.ProfileId},
		}))
		if err != nil {
			return nil, fmt.Errorf("SelectMergeStacktraces by profile id: %w", err)
		}
		out.ExemplarStacktracesTotal = graph.Msg.Flamegraph.GetTotal()
	}

	side := func() *querierv1.SelectMergeStacktracesRequest {
		return &querierv1.SelectMergeStacktracesRequest{ProfileTypeID: profileType, LabelSelector: selector, Start: start, End: end}
	}
	diff, err := client.Diff(ctx, connect.NewRequest(&querierv1.DiffRequest{Left: side(), Right: side()}))
	if err != nil {
		return nil, fmt.Errorf("Diff: %w", err)
	}
	out.DiffLeftTicks = diff.Msg.Flamegraph.GetLeftTicks()
	out.DiffRightTicks = diff.Msg.Flamegraph.GetRightTicks()

	stats, err := client.GetProfileStats(ctx, connect.NewRequest(&typesv1.GetProfileStatsRequest{}))
	if err != nil {
		return nil, fmt.Errorf("GetProfileStats: %w", err)
	}
	out.DataIngested = stats.Msg.DataIngested
	out.OldestProfileTime = stats.Msg.OldestProfileTime
	out.NewestProfileTime = stats.Msg.NewestProfileTime

	_, err = client.SelectHeatmap(ctx, connect.NewRequest(&querierv1.SelectHeatmapRequest{
		ProfileTypeID: profileType, LabelSelector: selector, Start: start, End: end, Step: step,
	}))
	out.SelectHeatmap = code(err)
	_, err = client.AnalyzeQuery(ctx, connect.NewRequest(&querierv1.AnalyzeQueryRequest{Start: start, End: end, Query: profileType + selector}))
	out.AnalyzeQuery = code(err)
	return out, nil
}

// code is a call's Connect error code, or "ok".
func code(err error) string {
	if err == nil {
		return "ok"
	}
	var connectErr *connect.Error
	if errors.As(err, &connectErr) {
		return connectErr.Code().String()
	}
	return err.Error()
}

func main() {
	if len(os.Args) != 7 {
		fmt.Fprintln(os.Stderr, "usage: grafana_querier_client STORE_URL PROFILE_TYPE LABEL_SELECTOR START_MS END_MS SPAN_ID")
		os.Exit(2)
	}
	start, err1 := strconv.ParseInt(os.Args[4], 10, 64)
	end, err2 := strconv.ParseInt(os.Args[5], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	codecs := []struct {
		name    string
		options []connect.ClientOption
	}{
		{"proto", nil},
		{"json", []connect.ClientOption{connect.WithProtoJSON()}},
	}
	var all []*answers
	for _, codec := range codecs {
		client := querierv1connect.NewQuerierServiceClient(http.DefaultClient, os.Args[1], codec.options...)
		out, err := call(codec.name, client, os.Args[2], os.Args[3], start, end, os.Args[6])
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s codec: %v\n", codec.name, err)
			os.Exit(1)
		}
		all = append(all, out)
	}
	if err := json.NewEncoder(os.Stdout).Encode(all); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
