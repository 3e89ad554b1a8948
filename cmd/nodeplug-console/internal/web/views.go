package web

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodeplug/nodeplug/cmd/nodeplug-console/internal/state"
	"github.com/nodeplug/nodeplug/cmd/nodeplug-console/internal/traces"
	"github.com/nodeplug/nodeplug/internal/jaegertrace"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
)

// The view models the templates render. Each fragment carries the services'
// connection status, so that it updates with the rest.

type serviceStatus struct {
	Name, Problem string
}

type statusView []serviceStatus

func statusOf(snap state.Snapshot) statusView {
	var out statusView
	for _, n := range []string{state.Watcher, state.Reconciler, state.DeviceManager} {
		out = append(out, serviceStatus{n, snap.Status[n]})
	}
	return out
}

type pluginRow struct {
	ID, Socket, Name, Type, State, Generation, Endpoint string
	Since, Age                                          string
	Failures                                            uint32
	LastError, NextRetry, TraceID                       string
}

type socketRow struct {
	Socket, Generation, Since, Age string
	Registered                     bool
}

type pluginsView struct {
	Status  statusView
	Plugins []pluginRow
	Sockets []socketRow
}

func pluginsOf(snap state.Snapshot, now time.Time) pluginsView {
	v := pluginsView{Status: statusOf(snap)}
	known := map[string]bool{}
	for _, p := range snap.Plugins {
		known[p.GetSocketPath()] = true
		r := pluginRow{
			ID: domID("plugin", p.GetSocketPath()), Socket: p.GetSocketPath(), Name: p.GetName(), Type: p.GetType(),
			State:      strings.ToLower(strings.TrimPrefix(p.GetState().String(), "PLUGIN_STATE_")),
			Generation: p.GetGeneration(), Endpoint: p.GetEndpoint(), Failures: p.GetFailures(),
			LastError: p.GetLastError(), TraceID: traces.NormalizeID(p.GetLastTraceId()),
		}
		r.Since, r.Age = since(p.GetLastTransitionTime(), now)
		if t := p.GetNextRetryTime(); t != nil && p.GetState().String() == "PLUGIN_STATE_FAILED" {
			r.NextRetry = t.AsTime().UTC().Format(time.TimeOnly)
		}
		v.Plugins = append(v.Plugins, r)
	}
	for _, s := range snap.Sockets {
		r := socketRow{Socket: s.GetPath(), Generation: s.GetGeneration(), Registered: known[s.GetPath()]}
		r.Since, r.Age = since(s.GetObservedTime(), now)
		v.Sockets = append(v.Sockets, r)
	}
	return v
}

type deviceCell struct {
	Resource, ID, State, Label string
}

type endpointRow struct {
	Endpoint, Path, State, Generation, Versions, Since, Age string
	Primary                                                 bool
}

type resourceView struct {
	ID, Name                    string
	Capacity, Allocatable, Free int64
	Devices                     []deviceCell
	Endpoints                   []endpointRow
	GraceDeadline               string
}

type resourcesView struct {
	Status    statusView
	Resources []resourceView
}

func resourcesOf(snap state.Snapshot, now time.Time) resourcesView {
	v := resourcesView{Status: statusOf(snap)}
	for _, r := range snap.Resources {
		rv := resourceView{ID: domID("res", r.GetName()), Name: r.GetName(), Capacity: r.GetCapacity(), Allocatable: r.GetAllocatable(), Free: r.GetFree()}
		rv.Devices = deviceCells(r)
		for _, e := range r.GetEndpoints() {
			er := endpointRow{
				Endpoint: e.GetEndpoint(), Generation: e.GetGeneration(), Primary: e.GetPrimary(),
				Path:     strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(e.GetRegistrationPath().String(), "REGISTRATION_PATH_"), "_", " ")),
				State:    strings.ToLower(strings.TrimPrefix(e.GetState().String(), "ENDPOINT_STATE_")),
				Versions: strings.Join(e.GetVersions(), ", "),
			}
			er.Since, er.Age = since(e.GetRegisteredTime(), now)
			rv.Endpoints = append(rv.Endpoints, er)
		}
		if g := r.GetGraceDeadline(); g != nil {
			rv.GraceDeadline = g.AsTime().UTC().Format(time.TimeOnly)
		}
		v.Resources = append(v.Resources, rv)
	}
	return v
}

// deviceCells lists a resource's devices by ID with their state: an
// allocated device is "allocated" (or "allocated, unhealthy"), the others
// "healthy" or "unhealthy".
func deviceCells(r *dmv1.Resource) []deviceCell {
	health := map[string]string{}
	for _, id := range r.GetHealthyDeviceIds() {
		health[id] = "healthy"
	}
	for _, id := range r.GetUnhealthyDeviceIds() {
		health[id] = "unhealthy"
	}
	allocated := map[string]bool{}
	for _, id := range r.GetAllocatedDeviceIds() {
		allocated[id] = true
		if health[id] == "" {
			health[id] = "unknown"
		}
	}
	ids := make([]string, 0, len(health))
	for id := range health {
		ids = append(ids, id)
	}
	sortNatural(ids)
	out := make([]deviceCell, 0, len(ids))
	for _, id := range ids {
		c := deviceCell{Resource: r.GetName(), ID: id, State: health[id], Label: health[id]}
		if allocated[id] {
			c.State = "allocated"
			c.Label = "allocated"
			if health[id] != "healthy" {
				c.State, c.Label = "allocated-unhealthy", "allocated, "+health[id]
			}
		}
		out = append(out, c)
	}
	return out
}

type allocationRow struct {
	Pod, PodUID, Container, Resource, Since, Age, TraceID string
	Devices                                               []deviceCell
}

type allocationsView struct {
	Status      statusView
	Allocations []allocationRow
}

func allocationsOf(snap state.Snapshot, now time.Time) allocationsView {
	v := allocationsView{Status: statusOf(snap)}
	cells := map[string]deviceCell{}
	for _, r := range snap.Resources {
		for _, c := range deviceCells(r) {
			cells[r.GetName()+"\x00"+c.ID] = c
		}
	}
	for _, a := range snap.Allocations {
		row := allocationRow{PodUID: a.GetPodUid(), Container: a.GetContainerName(), Resource: a.GetResourceName(), TraceID: traces.NormalizeID(a.GetTraceId())}
		if a.GetPodName() != "" {
			row.Pod = a.GetPodNamespace() + "/" + a.GetPodName()
		}
		row.Since, row.Age = since(a.GetAllocatedTime(), now)
		for _, id := range a.GetDeviceIds() {
			c, ok := cells[a.GetResourceName()+"\x00"+id]
			if !ok {
				c = deviceCell{Resource: a.GetResourceName(), ID: id, State: "allocated", Label: "allocated"}
			}
			row.Devices = append(row.Devices, c)
		}
		v.Allocations = append(v.Allocations, row)
	}
	return v
}

type tracesView struct {
	Sources string
	Error   string
	Traces  []traceRow
}

type traceRow struct {
	TraceID, Root, Service, Services, Start, Duration string
	Spans                                             int
	Failed                                            bool
}

func traceRowOf(s traces.Summary) traceRow {
	return traceRow{
		TraceID: s.TraceID, Root: s.Root, Service: s.Service, Services: strings.Join(s.Services, ", "),
		Start: time.UnixMicro(s.StartTime).UTC().Format("15:04:05.000"), Duration: jaegertrace.FormatMicros(s.Duration), Spans: s.Spans, Failed: s.Failed,
	}
}

// waterfall is one trace drawn as rows on a common time axis of 0..1000.
type waterfall struct {
	TraceID, Sources, Error string
	Found                   bool
	Spans, Services         int
	ServiceNames            string
	Duration                string
	Rows                    []spanRow
}

type spanRow struct {
	ID, Parent, Service, Name, Kind, Start, Duration string
	Depth, ServiceIndex                              int
	X, W                                             float64
	Failed                                           bool
	Attrs                                            []attr
	Links                                            []string
}

type attr struct{ Key, Value string }

func waterfallOf(t *traces.Trace) waterfall {
	wf := waterfall{TraceID: t.TraceID, Found: true, Spans: len(t.Spans)}
	if len(t.Spans) == 0 {
		return wf
	}
	sum := traces.Summarize(t)
	wf.Services, wf.ServiceNames, wf.Duration = len(sum.Services), strings.Join(sum.Services, ", "), jaegertrace.FormatMicros(sum.Duration)
	svcIndex := map[string]int{}
	for i, s := range sum.Services {
		svcIndex[s] = i % 6
	}
	total := float64(max(sum.Duration, 1))
	for _, o := range t.Waterfall() {
		s := &t.Spans[o.Index]
		r := spanRow{
			ID: s.SpanID, Parent: s.Parent(), Service: t.Service(s), Name: s.OperationName, Depth: min(o.Depth, 12),
			Start: "+" + jaegertrace.FormatMicros(s.StartTime-sum.StartTime), Duration: jaegertrace.FormatMicros(s.Duration), Failed: s.Failed(),
		}
		r.ServiceIndex = svcIndex[r.Service]
		r.X = math.Round(float64(s.StartTime-sum.StartTime)/total*10000) / 10
		r.W = math.Max(math.Round(float64(s.Duration)/total*10000)/10, 2)
		r.X = math.Min(r.X, 1000-r.W)
		for _, kv := range s.Tags {
			if kv.Key == "span.kind" {
				r.Kind = fmt.Sprint(kv.Value)
			}
			r.Attrs = append(r.Attrs, attr{kv.Key, fmt.Sprint(kv.Value)})
		}
		for _, ref := range s.References {
			if ref.RefType == "FOLLOWS_FROM" {
				r.Links = append(r.Links, ref.TraceID)
			}
		}
		wf.Rows = append(wf.Rows, r)
	}
	return wf
}

func since(ts *timestamppb.Timestamp, now time.Time) (rfc3339, age string) {
	if ts == nil || !ts.IsValid() || ts.AsTime().IsZero() {
		return "", ""
	}
	t := ts.AsTime()
	return t.UTC().Format(time.RFC3339Nano), fmtAge(now.Sub(t))
}

func fmtAge(d time.Duration) string {
	s := int64(max(d, 0) / time.Second)
	switch {
	case s < 60:
		return fmt.Sprintf("%ds", s)
	case s < 3600:
		return fmt.Sprintf("%dm%ds", s/60, s%60)
	case s < 86400:
		return fmt.Sprintf("%dh%dm", s/3600, s%3600/60)
	default:
		return fmt.Sprintf("%dd%dh", s/86400, s%86400/3600)
	}
}

// domID makes an HTML id from a prefix and a key.
func domID(prefix, key string) string {
	var b strings.Builder
	b.WriteString(prefix)
	b.WriteByte('-')
	for _, r := range key {
		if r < 128 && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	return b.String()
}

// sortNatural sorts dev-2 before dev-10.
func sortNatural(ids []string) {
	sort.SliceStable(ids, func(a, b int) bool { return naturalLess(ids[a], ids[b]) })
}

func naturalLess(a, b string) bool {
	for a != "" && b != "" {
		da, db := digits(a), digits(b)
		if da > 0 && db > 0 {
			na, nb := strings.TrimLeft(a[:da], "0"), strings.TrimLeft(b[:db], "0")
			if len(na) != len(nb) {
				return len(na) < len(nb)
			}
			if na != nb {
				return na < nb
			}
			a, b = a[da:], b[db:]
			continue
		}
		if a[0] != b[0] {
			return a[0] < b[0]
		}
		a, b = a[1:], b[1:]
	}
	return len(a) < len(b)
}

func digits(s string) int {
	n := 0
	for n < len(s) && s[n] >= '0' && s[n] <= '9' {
		n++
	}
	return n
}
