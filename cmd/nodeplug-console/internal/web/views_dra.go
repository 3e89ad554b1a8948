package web

import (
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nodeplug/nodeplug/cmd/nodeplug-console/internal/state"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
)

// The DRA view: the devicemanager's DRA drivers with their instances, this
// node's ResourceSlices with their devices, and the claims prepared here.

type draInstanceRow struct {
	Endpoint, Socket                                     pathText
	Generation                                           genText
	ConnState, Service, HealthService                    string
	Offered, LastError, Since, Age, StateSince, StateAge string
	Connected, Serving, HasHealth                        bool
}

type draDriverView struct {
	ID, Name       string
	DeletionDue    string // when the driver's slices go, with no instance left
	Instances      []draInstanceRow
	Slices, Device int // the driver's slices and devices on this node
}

type kv struct{ Key, Value string }

type sliceDevice struct {
	Driver, Pool, Name, Health, HealthMessage string
	Attributes, Capacity                      []kv
}

type sliceView struct {
	ID, Name, Driver, Pool, Node, ResourceVersion, Since, Age string
	PoolGeneration, PoolSlices                                int64
	Devices                                                   []sliceDevice
}

type claimDeviceRow struct {
	Driver, Pool, Device, Requests, CDI, Health string
}

type claimRow struct {
	ID, Namespace, Name, UID, State, Reason, Node, Pods, CDI, Since, Age string
	AllocatedHere                                                        bool
	Devices                                                              []claimDeviceRow
}

type draView struct {
	Status         statusView
	Drivers        []draDriverView
	Slices         []sliceView
	Claims         []claimRow
	DriversProblem string
	ClaimsProblem  string
}

// draStatusOf is the devicemanager's line and its DRA side's.
func draStatusOf(snap state.Snapshot) statusView {
	return statusView{{state.DeviceManager, snap.Status[state.DeviceManager]}, {state.DRA, snap.Status[state.DRA]}}
}

func draOf(snap state.Snapshot, now time.Time, root string) draView {
	v := draView{Status: draStatusOf(snap), DriversProblem: snap.DriversProblem, ClaimsProblem: snap.ClaimsProblem}
	perDriver := map[string][2]int{}
	for _, s := range snap.Slices {
		c := perDriver[s.GetDriver()]
		perDriver[s.GetDriver()] = [2]int{c[0] + 1, c[1] + len(s.GetDevices())}
		v.Slices = append(v.Slices, sliceOf(s, now))
	}
	for _, d := range snap.DRADrivers {
		dv := draDriverView{ID: domID("dra", d.GetName()), Name: d.GetName()}
		dv.Slices, dv.Device = perDriver[d.GetName()][0], perDriver[d.GetName()][1]
		if t := d.GetSliceDeletionTime(); t != nil && t.IsValid() && !t.AsTime().IsZero() {
			dv.DeletionDue = t.AsTime().UTC().Format(time.TimeOnly)
		}
		for _, in := range d.GetInstances() {
			r := draInstanceRow{
				Endpoint: relPath(root, in.GetEndpoint()), Socket: relPath(root, in.GetSocketPath()), Generation: generationOf(in.GetGeneration()),
				ConnState: in.GetConnectionState(), Service: in.GetService(), Offered: strings.Join(in.GetOfferedServices(), ", "),
				Connected: in.GetConnected(), Serving: in.GetServing(), HasHealth: in.GetHealthService(),
				HealthService: in.GetHealthServiceName(), LastError: in.GetLastError(),
			}
			if r.ConnState == "" {
				r.ConnState = map[bool]string{true: "connected", false: "not connected"}[r.Connected]
			}
			r.Since, r.Age = since(in.GetRegisteredTime(), now)
			r.StateSince, r.StateAge = since(in.GetStateChangeTime(), now)
			dv.Instances = append(dv.Instances, r)
		}
		v.Drivers = append(v.Drivers, dv)
	}
	for _, c := range snap.Claims {
		v.Claims = append(v.Claims, claimOf(c, now))
	}
	return v
}

func sliceOf(s *dmv1.ResourceSlice, now time.Time) sliceView {
	sv := sliceView{
		ID: domID("slice", s.GetName()), Name: s.GetName(), Driver: s.GetDriver(), Pool: s.GetPool().GetName(),
		Node: s.GetNodeName(), ResourceVersion: s.GetResourceVersion(),
		PoolGeneration: s.GetPool().GetGeneration(), PoolSlices: s.GetPool().GetResourceSliceCount(),
	}
	sv.Since, sv.Age = since(s.GetCreationTime(), now)
	for _, d := range s.GetDevices() {
		health := strings.ToLower(d.GetHealth())
		if health == "" {
			health = "unknown"
		}
		sv.Devices = append(sv.Devices, sliceDevice{
			Driver: s.GetDriver(), Pool: sv.Pool, Name: d.GetName(), Health: health, HealthMessage: d.GetHealthMessage(),
			Attributes: sortedKV(d.GetAttributes()), Capacity: sortedKV(d.GetCapacity()),
		})
	}
	slices.SortStableFunc(sv.Devices, func(a, b sliceDevice) int {
		if naturalLess(a.Name, b.Name) {
			return -1
		}
		if naturalLess(b.Name, a.Name) {
			return 1
		}
		return 0
	})
	return sv
}

func sortedKV(m map[string]string) []kv {
	out := make([]kv, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, kv{k, m[k]})
	}
	return out
}

func claimOf(c *dmv1.Claim, now time.Time) claimRow {
	r := claimRow{
		ID: domID("claim", c.GetNamespace()+"/"+c.GetName()), Namespace: c.GetNamespace(), Name: c.GetName(), UID: c.GetUid(),
		State:  strings.ToLower(strings.TrimPrefix(c.GetState().String(), "CLAIM_STATE_")),
		Reason: c.GetReason(), Node: c.GetAllocatedNode(), AllocatedHere: c.GetAllocatedHere(),
		CDI: strings.Join(c.GetCdiDeviceIds(), ", "),
	}
	r.Since, r.Age = since(c.GetCreationTime(), now)
	var pods []string
	for _, p := range c.GetPods() {
		if p.GetName() != "" {
			pods = append(pods, p.GetName()+" ("+p.GetUid()+")")
		} else {
			pods = append(pods, p.GetUid())
		}
	}
	r.Pods = strings.Join(pods, ", ")
	for _, d := range c.GetDevices() {
		health := strings.ToLower(d.GetHealth())
		if d.GetHealthMessage() != "" {
			health += ": " + d.GetHealthMessage()
		}
		r.Devices = append(r.Devices, claimDeviceRow{
			Driver: d.GetDriver(), Pool: d.GetPool(), Device: d.GetDevice(), Requests: strings.Join(d.GetRequests(), ", "),
			CDI: strings.Join(d.GetCdiDeviceIds(), ", "), Health: health,
		})
	}
	return r
}
