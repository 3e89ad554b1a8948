package web

import (
	"fmt"
	"math"
	"net/url"
	"slices"
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
	ID, Name, Type, State         string
	Socket, Endpoint              pathText
	Generation                    genText
	Since, Age                    string
	Failures                      uint32
	LastError, NextRetry, TraceID string
}

type socketRow struct {
	Socket     pathText
	Generation genText
	Since, Age string
	Registered bool
}

type pluginsView struct {
	Status  statusView
	Plugins []pluginRow
	Sockets []socketRow
}

func pluginsOf(snap state.Snapshot, now time.Time, root string) pluginsView {
	v := pluginsView{Status: statusOf(snap)}
	known := map[string]bool{}
	for _, p := range snap.Plugins {
		known[p.GetSocketPath()] = true
		r := pluginRow{
			ID: domID("plugin", p.GetSocketPath()), Socket: relPath(root, p.GetSocketPath()), Name: p.GetName(), Type: p.GetType(),
			State:      strings.ToLower(strings.TrimPrefix(p.GetState().String(), "PLUGIN_STATE_")),
			Generation: generationOf(p.GetGeneration()), Failures: p.GetFailures(),
			LastError: p.GetLastError(), TraceID: traces.NormalizeID(p.GetLastTraceId()),
		}
		if e := p.GetEndpoint(); e != "" && e != p.GetSocketPath() {
			r.Endpoint = relPath(root, e)
		}
		r.Since, r.Age = since(p.GetLastTransitionTime(), now)
		if t := p.GetNextRetryTime(); t != nil && p.GetState().String() == "PLUGIN_STATE_FAILED" {
			r.NextRetry = t.AsTime().UTC().Format(time.TimeOnly)
		}
		v.Plugins = append(v.Plugins, r)
	}
	for _, s := range snap.Sockets {
		r := socketRow{Socket: relPath(root, s.GetPath()), Generation: generationOf(s.GetGeneration()), Registered: known[s.GetPath()]}
		r.Since, r.Age = since(s.GetObservedTime(), now)
		v.Sockets = append(v.Sockets, r)
	}
	return v
}

type deviceCell struct {
	Resource, ID, State, Label string
}

type endpointRow struct {
	Endpoint                          pathText
	Generation                        genText
	Path, State, Versions, Since, Age string
	Primary                           bool
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

func resourcesOf(snap state.Snapshot, now time.Time, root string) resourcesView {
	v := resourcesView{Status: statusOf(snap)}
	for _, r := range snap.Resources {
		rv := resourceView{ID: domID("res", r.GetName()), Name: r.GetName(), Capacity: r.GetCapacity(), Allocatable: r.GetAllocatable(), Free: r.GetFree()}
		rv.Devices = deviceCells(r)
		for _, e := range r.GetEndpoints() {
			er := endpointRow{
				Endpoint: relPath(root, e.GetEndpoint()), Generation: generationOf(e.GetGeneration()), Primary: e.GetPrimary(),
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
	// FilterError says what of the filter was not understood (and left
	// out).
	FilterError string
	// Filtered is set when the list is filtered; Matched is how many
	// traces passed, of which Traces are the latest.
	Filtered bool
	Matched  int
	Traces   []traceRow
}

type traceRow struct {
	TraceID, Service, ServiceNames, Start, StartFull, Duration string
	Root                                                       opText
	Services                                                   []serviceName
	Spans                                                      int
	Failed                                                     bool
}

// serviceName is a service in the trace list: Short without the
// "nodeplug-" every service of the stack has; Root for the root span's.
type serviceName struct {
	Short string
	Root  bool
}

func traceRowOf(s traces.Summary) traceRow {
	start := time.UnixMicro(s.StartTime).UTC()
	r := traceRow{
		TraceID: s.TraceID, Root: opOf(s.Root), Service: s.Service,
		Start: start.Format("15:04:05.000"), StartFull: start.Format("2006-01-02 15:04:05.000000 UTC"),
		Duration: jaegertrace.FormatMicros(s.Duration), Spans: s.Spans, Failed: s.Failed,
	}
	// The root span's service first, then the others in their order.
	names := []string{}
	if s.Service != "" {
		names = append(names, s.Service)
	}
	for _, n := range s.Services {
		if n != s.Service {
			names = append(names, n)
		}
	}
	r.ServiceNames = strings.Join(names, ", ")
	for _, n := range names {
		r.Services = append(r.Services, serviceName{Short: strings.TrimPrefix(n, "nodeplug-"), Root: n == s.Service})
	}
	return r
}

// filterView is the traces page's filter form, filled from the page's
// query (as typed, so that a value not understood can be corrected), with
// the service and operation names to choose from.
type filterView struct {
	Service, Operation, MinDuration, Status, Query string
	Services, Operations                           []string
}

func filterViewOf(q url.Values, services, operations []string) *filterView {
	v := &filterView{
		Service: q.Get("service"), Operation: q.Get("operation"), MinDuration: q.Get("minDuration"),
		Status: q.Get("status"), Query: q.Get("q"), Operations: operations,
	}
	v.Services = services
	if v.Service != "" && !slices.Contains(services, v.Service) {
		v.Services = append(slices.Clone(services), v.Service)
	}
	return v
}

// filterQuery is the part of a page's query that is its trace filter.
func filterQuery(q url.Values) url.Values {
	out := url.Values{}
	for _, k := range []string{"service", "operation", "minDuration", "status", "q"} {
		if v := strings.TrimSpace(q.Get(k)); v != "" {
			out.Set(k, v)
		}
	}
	return out
}

// waterfall is one trace drawn as rows on a common time axis of 0..1000,
// under a ruler of Ticks.
type waterfall struct {
	TraceID, Sources, Error string
	Found                   bool
	Spans, Services         int
	ServiceNames            string
	Duration                string
	Ticks                   []tick
	Rows                    []spanRow
}

type spanRow struct {
	ID, Parent, Service, ServiceShort, Kind, Start, Duration string
	Name                                                     opText
	NameParts, PackageParts                                  []string // to wrap in the attributes' heading
	Depth, ServiceIndex                                      int
	X, W                                                     float64
	Failed                                                   bool
	Attrs                                                    []attr
	Links                                                    []string
}

// attr is one attribute of a span: its value as given, shortened when it
// is a path beneath the root dir; Search is set for a value worth finding
// other traces by (a name, a path, a UID).
type attr struct {
	Key    string
	Value  pathText
	Parts  []string // Value.Short, cut where it may wrap
	Search string
}

// searchable are the attributes whose values name a plugin, a resource, a
// socket, a pod or a claim: the span's attributes link to the traces that
// carry the same value.
var searchable = map[string]bool{
	"socket.path": true, "nodeplug.socket_path": true, "nodeplug.plugin.name": true, "nodeplug.plugin.endpoint": true,
	"server.address": true, "pod_uid": true, "pod.uid": true, "claim.uid": true,
}

func waterfallOf(t *traces.Trace, root string) waterfall {
	wf := waterfall{TraceID: t.TraceID, Found: true, Spans: len(t.Spans)}
	if len(t.Spans) == 0 {
		return wf
	}
	sum := traces.Summarize(t)
	wf.Services, wf.ServiceNames, wf.Duration = len(sum.Services), strings.Join(sum.Services, ", "), jaegertrace.FormatMicros(sum.Duration)
	wf.Ticks = rulerOf(sum.Duration)
	svcIndex := map[string]int{}
	for i, s := range sum.Services {
		svcIndex[s] = i % 6
	}
	total := float64(max(sum.Duration, 1))
	for _, o := range t.Waterfall() {
		s := &t.Spans[o.Index]
		r := spanRow{
			ID: s.SpanID, Parent: s.Parent(), Service: t.Service(s), Name: opOf(s.OperationName), Depth: min(o.Depth, 12),
			Start: "+" + jaegertrace.FormatMicros(s.StartTime-sum.StartTime), Duration: jaegertrace.FormatMicros(s.Duration), Failed: s.Failed(),
		}
		r.NameParts, r.PackageParts = breakable(r.Name.Name), breakable(r.Name.Package)
		r.ServiceShort = strings.TrimPrefix(r.Service, "nodeplug-")
		r.ServiceIndex = svcIndex[r.Service]
		r.X = math.Round(float64(s.StartTime-sum.StartTime)/total*10000) / 10
		r.W = math.Max(math.Round(float64(s.Duration)/total*10000)/10, 2)
		r.X = math.Min(r.X, 1000-r.W)
		for _, kv := range s.Tags {
			v := fmt.Sprint(kv.Value)
			if kv.Key == "span.kind" {
				r.Kind = v
			}
			a := attr{Key: kv.Key, Value: relPath(root, v)}
			a.Parts = breakable(a.Value.Short)
			if str, ok := kv.Value.(string); ok && searchable[kv.Key] && str != "" {
				a.Search = "/traces?" + url.Values{"q": {str}}.Encode()
			}
			r.Attrs = append(r.Attrs, a)
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
