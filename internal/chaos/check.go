package chaos

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Violation is one broken invariant.
type Violation struct {
	Invariant string `json:"invariant"` // "a" .. "d", as in the issue
	When      string `json:"when"`      // which check found it
	Detail    string `json:"detail"`
}

func (v Violation) String() string { return fmt.Sprintf("(%s) %s: %s", v.Invariant, v.When, v.Detail) }

// AllocKey names one allocation: a pod's container's resource.
type AllocKey struct {
	Pod, Container, Resource string
}

func (k AllocKey) String() string { return k.Pod + "/" + k.Container + "/" + k.Resource }

// Listed is one allocation as ListAllocations reported it.
type Listed struct {
	Key     AllocKey
	Devices []string
}

// ListedPlugin is one reconciler plugin entry.
type ListedPlugin struct {
	Socket     string
	Registered bool
	State      string // for messages
	LastError  string // for messages
}

// ListedResource is one devicemanager resource.
type ListedResource struct {
	Name        string
	Allocatable int64
	Sockets     []string // the socket paths of its endpoints
}

// LivePlugin is a plugin the harness runs and that is serving.
type LivePlugin struct {
	Resource string
	Socket   string
	Devices  int64
	Registry bool // registered through plugins_registry (else kubelet.sock)
}

// State is everything one check looks at: what the clients were told
// (Acked, Released) and what the services list. It is pure data, so the
// checker can be tested without a stack.
type State struct {
	// Acked are the acknowledged allocations not released since, with the
	// devices each answer named.
	Acked map[AllocKey][]string
	// Released are pods whose Release was acknowledged; none of their
	// allocations may be listed again.
	Released map[string]bool
	// Allocations is ListAllocations' answer.
	Allocations []Listed
	// Specs are the CDI device names of the devicemanager's container
	// specs in its spec directory, compared (k) only when CheckSpecs.
	CheckSpecs bool
	Specs      map[string]bool
	// Plugins, Resources and Live are compared only when CheckPlugins.
	CheckPlugins bool
	Plugins      []ListedPlugin
	Resources    []ListedResource
	Live         []LivePlugin
}

// Check returns every violation of (a), (b) and (c) in s. when labels them.
func Check(when string, s State) []Violation {
	var out []Violation
	add := func(inv, format string, args ...any) {
		out = append(out, Violation{Invariant: inv, When: when, Detail: fmt.Sprintf(format, args...)})
	}
	listed := map[AllocKey][]string{}
	for _, a := range s.Allocations {
		if _, dup := listed[a.Key]; dup {
			add("b", "allocation %s listed twice", a.Key)
		}
		listed[a.Key] = a.Devices
		if s.Released[a.Key.Pod] {
			add("a", "allocation %s listed after its pod's release was acknowledged", a.Key)
		}
	}
	// (a) every acknowledged, unreleased allocation is listed, same devices.
	keys := make([]AllocKey, 0, len(s.Acked))
	for k := range s.Acked {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
	for _, k := range keys {
		want := sorted(s.Acked[k])
		got, ok := listed[k]
		switch {
		case !ok:
			add("a", "acknowledged allocation %s (%s) is not listed", k, strings.Join(want, ","))
		case !slices.Equal(want, sorted(got)):
			add("a", "allocation %s lists devices %s, acknowledged %s", k, strings.Join(sorted(got), ","), strings.Join(want, ","))
		}
	}
	// (b) no device held by two allocations.
	holder := map[string]AllocKey{}
	for _, a := range s.Allocations {
		for _, d := range a.Devices {
			dev := a.Key.Resource + "/" + d
			if prev, ok := holder[dev]; ok && prev != a.Key {
				add("b", "device %s held by %s and %s", dev, prev, a.Key)
				continue
			}
			holder[dev] = a.Key
		}
	}
	if s.CheckSpecs {
		out = append(out, checkSpecs(when, s)...)
	}
	if !s.CheckPlugins {
		return out
	}
	// (c) no socket registered twice; the lists match the live plugins.
	seen := map[string]int{}
	for _, p := range s.Plugins {
		seen[p.Socket]++
	}
	for sock, n := range seen {
		if n > 1 {
			add("c", "socket %s listed %d times by ListPlugins", sock, n)
		}
	}
	owner := map[string]string{}
	res := map[string]ListedResource{}
	for _, r := range s.Resources {
		res[r.Name] = r
		for _, sock := range r.Sockets {
			if prev, ok := owner[sock]; ok {
				add("c", "socket %s is an endpoint of %s and of %s", sock, prev, r.Name)
			}
			owner[sock] = r.Name
		}
	}
	if msg := Mismatch(s.Plugins, s.Resources, s.Live); msg != "" {
		add("c", "%s", msg)
	}
	return out
}

// invSpecs is the invariant of the containers' CDI specs.
const invSpecs = "k"

// checkSpecs checks (k): every container with an allocation listed has
// its CDI spec, and no spec is left of a container with none (the sample
// plugins answer every Allocate with an env, so each allocated container
// has a spec). The load's pod UIDs and container names are plain, so a
// spec's device is named <pod UID>_<container> (docs/containers-and-cdi.md,
// "A device plugin's devices").
func checkSpecs(when string, s State) []Violation {
	const inv = invSpecs
	var out []Violation
	want := map[string]bool{}
	for _, a := range s.Allocations {
		want[a.Key.Pod+"_"+a.Key.Container] = true
	}
	for _, n := range sorted(keysOf(want)) {
		if !s.Specs[n] {
			out = append(out, Violation{Invariant: inv, When: when, Detail: "allocated container " + n + " has no CDI spec"})
		}
	}
	for _, n := range sorted(keysOf(s.Specs)) {
		if !want[n] {
			out = append(out, Violation{Invariant: inv, When: when, Detail: "CDI spec of " + n + " left with no allocation listed"})
		}
	}
	return out
}

func keysOf(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// Mismatch says how the listed plugins and resources differ from the live
// plugins, or "" when they match: every plugins_registry plugin listed once
// and registered, no other device plugin socket listed; every live
// plugin's resource allocatable in full with its socket as an endpoint; no
// other resource allocatable.
func Mismatch(plugins []ListedPlugin, resources []ListedResource, live []LivePlugin) string {
	var problems []string
	listed := map[string]ListedPlugin{}
	for _, p := range plugins {
		listed[p.Socket] = p
	}
	wantSock := map[string]bool{}
	wantRes := map[string]LivePlugin{}
	for _, l := range live {
		wantRes[l.Resource] = l
		if !l.Registry {
			continue
		}
		wantSock[l.Socket] = true
		p, ok := listed[l.Socket]
		switch {
		case !ok:
			problems = append(problems, l.Socket+" not listed")
		case !p.Registered:
			problems = append(problems, l.Socket+" not registered")
		}
	}
	for _, p := range plugins {
		if !wantSock[p.Socket] {
			problems = append(problems, fmt.Sprintf("%s listed but not live (%s %s)", p.Socket, p.State, p.LastError))
		}
	}
	byName := map[string]ListedResource{}
	for _, r := range resources {
		byName[r.Name] = r
		if _, ok := wantRes[r.Name]; !ok && r.Allocatable > 0 {
			problems = append(problems, fmt.Sprintf("%s allocatable %d but no live plugin", r.Name, r.Allocatable))
		}
	}
	for name, l := range wantRes {
		r, ok := byName[name]
		switch {
		case !ok:
			problems = append(problems, name+" not listed")
		case r.Allocatable != l.Devices:
			problems = append(problems, fmt.Sprintf("%s allocatable %d, want %d", name, r.Allocatable, l.Devices))
		case !slices.Contains(r.Sockets, l.Socket):
			problems = append(problems, fmt.Sprintf("%s has no endpoint at %s (has %v)", name, l.Socket, r.Sockets))
		}
	}
	sort.Strings(problems)
	if len(problems) > 5 {
		problems = append(problems[:5], fmt.Sprintf("and %d more", len(problems)-5))
	}
	return strings.Join(problems, "; ")
}

func sorted(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}

// DipTracker implements (d): it follows allocatable per resource and
// reports a drop below the plugin's device count once the resource was
// seen in full, for resources it is told to watch.
type DipTracker struct {
	want map[string]int64 // resource → devices, for the plugins watched
	full map[string]bool
}

// NewDipTracker watches the given resources (name → device count).
func NewDipTracker(want map[string]int64) *DipTracker {
	return &DipTracker{want: want, full: map[string]bool{}}
}

// Observe takes one WatchResources item (removed: the resource went
// away) and returns a description of the dip it shows, or "".
func (d *DipTracker) Observe(resource string, allocatable int64, removed bool) string {
	n, ok := d.want[resource]
	if !ok {
		return ""
	}
	if removed {
		allocatable = 0
	}
	if allocatable >= n {
		d.full[resource] = true
		return ""
	}
	if !d.full[resource] {
		return ""
	}
	return fmt.Sprintf("%s allocatable %d of %d (removed=%v)", resource, allocatable, n, removed)
}
