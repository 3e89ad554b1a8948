package main

import (
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	reconcilerv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
	watcherv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/watcher/v1"
	"github.com/nodeplug/nodeplug/pkg/layout"
)

// writeJSON prints m as indented JSON (protojson field names, int64 as
// strings, as grpcurl shows them).
func writeJSON(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// writeJSONLine prints m as one line of JSON (for streams).
func writeJSONLine(w io.Writer, m proto.Message) error {
	b, err := protojson.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// traceID is id, or "" for an all-zero (invalid) trace ID: what a service
// reports for an attempt made with tracing turned off.
func traceID(id string) string {
	if strings.Trim(id, "0") == "" {
		return ""
	}
	return id
}

func list(ss []string) string {
	if len(ss) == 0 {
		return "-"
	}
	return strings.Join(ss, ",")
}

// age renders the time since t compactly ("12s", "5m", "3h", "2d"); "-" for
// an unset time.
func age(now time.Time, t *timestamppb.Timestamp) string {
	if t == nil || (t.GetSeconds() == 0 && t.GetNanos() == 0) {
		return "-"
	}
	d := now.Sub(t.AsTime())
	if d < 0 {
		d = 0
	}
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	default:
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	}
}

// until renders the time left until t ("in 4s", "now").
func until(now time.Time, t *timestamppb.Timestamp) string {
	if t == nil {
		return ""
	}
	d := t.AsTime().Sub(now).Round(time.Second)
	if d <= 0 {
		return "now"
	}
	return "in " + d.String()
}

func pluginState(s reconcilerv1.PluginState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "PLUGIN_STATE_"))
}

// renderPlugins prints the reconciler's plugins and the device plugins
// registered on kubelet.sock in one table, by socket path; VIA says which
// way each registered.
func renderPlugins(w io.Writer, now time.Time, resp *reconcilerv1.ListPluginsResponse, legacy []kubeletSockPlugin) error {
	if len(resp.GetPlugins()) == 0 && len(legacy) == 0 {
		_, err := fmt.Fprintln(w, "no plugins: none in <root-dir>/plugins_registry, none registered on kubelet.sock")
		return err
	}
	type row struct{ socket, line string }
	var rows []row
	for _, p := range resp.GetPlugins() {
		errText := "-"
		if p.GetLastError() != "" {
			errText = p.GetLastError()
			if p.GetState() == reconcilerv1.PluginState_PLUGIN_STATE_FAILED {
				errText += fmt.Sprintf(" (failures %d, retry %s)", p.GetFailures(), until(now, p.GetNextRetryTime()))
			}
		}
		rows = append(rows, row{p.GetSocketPath(), fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			dash(p.GetName()), dash(p.GetType()), layout.PluginsRegistryDirName, pluginState(p.GetState()), p.GetSocketPath(),
			list(p.GetSupportedVersions()), age(now, p.GetLastTransitionTime()), dash(traceID(p.GetLastTraceId())), errText)})
	}
	for _, l := range legacy {
		e := l.endpoint
		since := e.GetRegisteredTime()
		if e.GetState() == dmv1.EndpointState_ENDPOINT_STATE_STOPPED && e.GetStoppedTime() != nil {
			since = e.GetStoppedTime()
		}
		rows = append(rows, row{e.GetEndpoint(), fmt.Sprintf("%s\tDevicePlugin\t%s\t%s\t%s\t%s\t%s\t-\t-\n",
			l.resource, layout.KubeletSocketName, legacyState(e.GetState()), e.GetEndpoint(), list(e.GetVersions()), age(now, since))})
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].socket < rows[j].socket })
	tw := newTable(w)
	fmt.Fprintln(tw, "NAME\tTYPE\tVIA\tSTATE\tSOCKET\tVERSIONS\tAGE\tTRACE ID\tERROR")
	for _, r := range rows {
		fmt.Fprint(tw, r.line)
	}
	return tw.Flush()
}

// legacyState words a kubelet.sock endpoint's state as the reconciler words
// a plugin's: registered (its stream is live), pending (connecting), or
// stopped (its stream ended; its devices are kept for the grace period).
func legacyState(s dmv1.EndpointState) string {
	switch s {
	case dmv1.EndpointState_ENDPOINT_STATE_LIVE:
		return "registered"
	case dmv1.EndpointState_ENDPOINT_STATE_CONNECTING:
		return "pending"
	default:
		return endpointState(s)
	}
}

// writePluginsJSON prints the reconciler's ListPlugins answer with the
// kubelet.sock plugins beside it, under "kubeletSockPlugins": each its
// resource name and the devicemanager's endpoint.
func writePluginsJSON(w io.Writer, resp *reconcilerv1.ListPluginsResponse, legacy []kubeletSockPlugin) error {
	b, err := protojson.Marshal(resp)
	if err != nil {
		return err
	}
	doc := map[string]json.RawMessage{}
	if err := json.Unmarshal(b, &doc); err != nil {
		return err
	}
	type entry struct {
		ResourceName string          `json:"resourceName"`
		Endpoint     json.RawMessage `json:"endpoint"`
	}
	entries := []entry{}
	for _, l := range legacy {
		eb, err := protojson.Marshal(l.endpoint)
		if err != nil {
			return err
		}
		entries = append(entries, entry{l.resource, eb})
	}
	if doc["kubeletSockPlugins"], err = json.Marshal(entries); err != nil {
		return err
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", out)
	return err
}

func renderDrivers(w io.Writer, now time.Time, resp *reconcilerv1.ListDriversResponse) error {
	if len(resp.GetCsiDrivers()) == 0 && len(resp.GetDraDrivers()) == 0 {
		_, err := fmt.Fprintln(w, "no CSI or DRA drivers registered")
		return err
	}
	tw := newTable(w)
	if csi := resp.GetCsiDrivers(); len(csi) > 0 {
		fmt.Fprintln(tw, "CSI DRIVER\tNODE ID\tVERSION\tMAX VOLUMES\tTOPOLOGY\tENDPOINT\tAGE")
		for _, d := range csi {
			var topo []string
			for k, v := range d.GetAccessibleTopology() {
				topo = append(topo, k+"="+v)
			}
			slices.Sort(topo)
			maxVol := "-"
			if d.GetMaxVolumesPerNode() > 0 {
				maxVol = fmt.Sprint(d.GetMaxVolumesPerNode())
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.GetName(), dash(d.GetNodeId()), dash(d.GetHighestVersion()),
				maxVol, list(topo), d.GetEndpoint(), age(now, d.GetRegisteredTime()))
		}
	}
	if dra := resp.GetDraDrivers(); len(dra) > 0 {
		if len(resp.GetCsiDrivers()) > 0 {
			fmt.Fprintln(tw)
		}
		fmt.Fprintln(tw, "DRA DRIVER\tVERSIONS\tENDPOINT\tAGE")
		for _, d := range dra {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", d.GetName(), list(d.GetSupportedVersions()), d.GetEndpoint(), age(now, d.GetRegisteredTime()))
		}
	}
	return tw.Flush()
}

func endpointState(s dmv1.EndpointState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "ENDPOINT_STATE_"))
}

func registrationPath(p dmv1.RegistrationPath) string {
	switch p {
	case dmv1.RegistrationPath_REGISTRATION_PATH_PLUGINS_REGISTRY:
		return layout.PluginsRegistryDirName
	case dmv1.RegistrationPath_REGISTRATION_PATH_KUBELET_SOCK:
		return layout.KubeletSocketName
	default:
		return "?"
	}
}

func renderResources(w io.Writer, now time.Time, resp *dmv1.ListResourcesResponse) error {
	res := slices.Clone(resp.GetResources())
	if len(res) == 0 {
		_, err := fmt.Fprintln(w, "no device plugin resources (no device plugin has registered)")
		return err
	}
	sort.Slice(res, func(i, j int) bool { return res[i].GetName() < res[j].GetName() })
	tw := newTable(w)
	fmt.Fprintln(tw, "RESOURCE\tCAPACITY\tALLOCATABLE\tFREE\tUNHEALTHY\tALLOCATED\tENDPOINTS")
	for _, r := range res {
		var eps []string
		for _, e := range r.GetEndpoints() {
			s := fmt.Sprintf("%s (%s via %s", filepath.Base(e.GetEndpoint()), endpointState(e.GetState()), registrationPath(e.GetRegistrationPath()))
			if e.GetState() == dmv1.EndpointState_ENDPOINT_STATE_STOPPED && r.GetGraceDeadline() != nil {
				s += ", removed " + until(now, r.GetGraceDeadline())
			}
			eps = append(eps, s+")")
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\t%s\n", r.GetName(), r.GetCapacity(), r.GetAllocatable(), r.GetFree(),
			list(r.GetUnhealthyDeviceIds()), list(r.GetAllocatedDeviceIds()), list(eps))
	}
	return tw.Flush()
}

func renderAllocations(w io.Writer, now time.Time, resp *dmv1.ListAllocationsResponse) error {
	allocs := slices.Clone(resp.GetAllocations())
	if len(allocs) == 0 {
		_, err := fmt.Fprintln(w, "no allocations")
		return err
	}
	sort.Slice(allocs, func(i, j int) bool {
		a, b := allocs[i], allocs[j]
		if a.GetPodUid() != b.GetPodUid() {
			return a.GetPodUid() < b.GetPodUid()
		}
		if a.GetContainerName() != b.GetContainerName() {
			return a.GetContainerName() < b.GetContainerName()
		}
		return a.GetResourceName() < b.GetResourceName()
	})
	tw := newTable(w)
	fmt.Fprintln(tw, "POD\tNAMESPACE/NAME\tCONTAINER\tRESOURCE\tDEVICES\tAGE\tTRACE ID")
	for _, a := range allocs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.GetPodUid(), podName(a.GetPodNamespace(), a.GetPodName()), a.GetContainerName(), a.GetResourceName(),
			list(a.GetDeviceIds()), age(now, a.GetAllocatedTime()), dash(traceID(a.GetTraceId())))
	}
	return tw.Flush()
}

func renderSockets(w io.Writer, now time.Time, resp *watcherv1.ListSocketsResponse) error {
	if len(resp.GetSockets()) == 0 {
		_, err := fmt.Fprintf(w, "no sockets in plugins_registry (watcher revision %d)\n", resp.GetRevision())
		return err
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "SOCKET\tGENERATION\tAGE")
	for _, s := range resp.GetSockets() {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", s.GetPath(), s.GetGeneration(), age(now, s.GetObservedTime()))
	}
	return tw.Flush()
}

// renderAllocation prints what one Allocate returned: the devices per
// resource, then what the plugin asked the runtime to do.
func renderAllocation(w io.Writer, resp *dmv1.AllocateResponse) error {
	pod := resp.GetPodUid()
	if resp.GetPodNamespace() != "" || resp.GetPodName() != "" {
		pod += " (" + podName(resp.GetPodNamespace(), resp.GetPodName()) + ")"
	}
	fmt.Fprintf(w, "pod %s container %s\n", pod, resp.GetContainerName())
	for _, a := range resp.GetAllocations() {
		var health []string
		for _, d := range a.GetDevices() {
			if d.GetHealth() == dmv1.DeviceHealth_DEVICE_HEALTH_UNHEALTHY {
				health = append(health, d.GetId()+" unhealthy")
			}
		}
		line := fmt.Sprintf("  %s: %s", a.GetResourceName(), list(a.GetDeviceIds()))
		if len(health) > 0 {
			line += " (" + strings.Join(health, ", ") + ")"
		}
		fmt.Fprintln(w, line)
		cr := a.GetContainerResponse()
		for _, k := range sortedKeys(cr.GetEnvs()) {
			fmt.Fprintf(w, "    env         %s=%s\n", k, cr.GetEnvs()[k])
		}
		for _, m := range cr.GetMounts() {
			ro := ""
			if m.GetReadOnly() {
				ro = " (read-only)"
			}
			fmt.Fprintf(w, "    mount       %s -> %s%s\n", m.GetHostPath(), m.GetContainerPath(), ro)
		}
		for _, d := range cr.GetDevices() {
			fmt.Fprintf(w, "    device      %s -> %s %s\n", d.GetHostPath(), d.GetContainerPath(), d.GetPermissions())
		}
		for _, d := range cr.GetCdiDevices() {
			fmt.Fprintf(w, "    cdi         %s\n", d.GetName())
		}
		for _, k := range sortedKeys(cr.GetAnnotations()) {
			fmt.Fprintf(w, "    annotation  %s=%s\n", k, cr.GetAnnotations()[k])
		}
	}
	return nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Stream lines: one line per item, prefixed with a time.

const lineTime = "15:04:05.000"

func socketEventLine(m *watcherv1.WatchSocketEventsResponse) string {
	if s := m.GetSynced(); s != nil {
		return fmt.Sprintf("-- synced: %d socket(s) at revision %d (watcher %s); live events follow", s.GetSocketCount(), s.GetRevision(), m.GetInstanceId())
	}
	ev := m.GetEvent()
	typ := strings.TrimPrefix(ev.GetType().String(), "SOCKET_EVENT_TYPE_")
	line := fmt.Sprintf("%s %-7s %s generation=%s revision=%d", ev.GetObservedTime().AsTime().Local().Format(lineTime), typ, ev.GetPath(), ev.GetGeneration(), ev.GetRevision())
	if ev.GetSnapshot() {
		line += " (snapshot)"
	}
	if tp := ev.GetTraceContext()["traceparent"]; tp != "" {
		if parts := strings.Split(tp, "-"); len(parts) == 4 {
			line += " trace=" + parts[1]
		}
	}
	return line
}

// itemTime is how a stream line shows when its item happened: t, or "-"
// (padded) when nothing says.
func itemTime(t *timestamppb.Timestamp) string {
	if t == nil || (t.GetSeconds() == 0 && t.GetNanos() == 0) {
		return fmt.Sprintf("%-*s", len(lineTime), "-")
	}
	return t.AsTime().Local().Format(lineTime)
}

// pluginChangeLine shows one WatchPlugins item. A live change is stamped
// when it arrived; a snapshot item (one that describes the state the
// stream started from) is stamped with the plugin's last transition and
// marked "(snapshot)", as watch sockets marks the watcher's.
func pluginChangeLine(now time.Time, m *reconcilerv1.WatchPluginsResponse, snapshot bool) string {
	if s := m.GetSynced(); s != nil {
		return fmt.Sprintf("-- synced at revision %d (reconciler %s); live changes follow", s.GetRevision(), m.GetInstanceId())
	}
	ch := m.GetChange()
	p := ch.GetPlugin()
	typ := strings.TrimPrefix(ch.GetType().String(), "PLUGIN_CHANGE_TYPE_")
	stamp := now.Local().Format(lineTime)
	if snapshot {
		stamp = itemTime(p.GetLastTransitionTime())
	}
	line := fmt.Sprintf("%s %-7s %s state=%s", stamp, typ, p.GetSocketPath(), pluginState(p.GetState()))
	if p.GetName() != "" {
		line += fmt.Sprintf(" name=%s type=%s", p.GetName(), p.GetType())
	}
	line += fmt.Sprintf(" revision=%d", ch.GetRevision())
	if id := traceID(p.GetLastTraceId()); id != "" {
		line += " trace=" + id
	}
	if p.GetLastError() != "" {
		line += fmt.Sprintf(" error=%q", p.GetLastError())
	}
	if snapshot {
		line += " (snapshot)"
	}
	return line
}

// resourceChangeLine shows one WatchResources item; a snapshot item is
// stamped with the last time one of its endpoints registered or stopped
// ("-" when it has none) and marked "(snapshot)".
func resourceChangeLine(now time.Time, m *dmv1.WatchResourcesResponse, snapshot bool) string {
	if s := m.GetSynced(); s != nil {
		return fmt.Sprintf("-- synced at revision %d (devicemanager %s); live changes follow", s.GetRevision(), m.GetInstanceId())
	}
	ch := m.GetChange()
	r := ch.GetResource()
	typ := strings.TrimPrefix(ch.GetType().String(), "RESOURCE_CHANGE_TYPE_")
	live := 0
	var last *timestamppb.Timestamp
	later := func(t *timestamppb.Timestamp) {
		if t != nil && (last == nil || t.AsTime().After(last.AsTime())) {
			last = t
		}
	}
	for _, e := range r.GetEndpoints() {
		if e.GetState() == dmv1.EndpointState_ENDPOINT_STATE_LIVE {
			live++
		}
		later(e.GetRegisteredTime())
		later(e.GetStoppedTime())
	}
	stamp := now.Local().Format(lineTime)
	if snapshot {
		stamp = itemTime(last)
	}
	line := fmt.Sprintf("%s %-7s %s capacity=%d allocatable=%d free=%d unhealthy=%s endpoints=%d/%d live revision=%d",
		stamp, typ, r.GetName(), r.GetCapacity(), r.GetAllocatable(), r.GetFree(),
		list(r.GetUnhealthyDeviceIds()), live, len(r.GetEndpoints()), ch.GetRevision())
	if snapshot {
		line += " (snapshot)"
	}
	return line
}

// podName shows a pod's namespace and name as namespace/name, or "-" for a
// pod known only by its UID.
func podName(namespace, name string) string {
	if namespace == "" && name == "" {
		return "-"
	}
	return namespace + "/" + name
}
