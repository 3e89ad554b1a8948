// This file describes damage inside a journal that Load passed over: the
// Gap, what its surviving bytes still name, and the records after it that
// removed what the state no longer held.
//
// What "recovered" means after a gap: every record is a whole put or
// removal of one named record (a resource, an allocation, a claim), so a
// record that a valid frame after the gap changed is as the last
// acknowledged change left it. A record last changed inside the gap is as
// the change before it left it: an allocation made there is missing (its
// devices look free), a release made there is undone (its devices look
// held), a registration made there is missing or older. A release after
// the gap of an allocation made inside it removes nothing: the state
// holds neither, which is what the release acknowledged, and the Gap
// lists it (Unmatched) as evidence of what the gap held.

package store

import (
	"fmt"
	"regexp"
	"strings"
)

// Gap is a span of a journal where a record was due and none could be
// read. The changes it held, if any, are unknown; the records after it
// were recovered (see the file comment for what that means).
type Gap struct {
	// Journal is the journal's path as it was named (it is moved aside).
	Journal string
	// From and To are byte offsets in the file: the span is [From, To).
	// Whole: the file could not be used at all (no header, a foreign
	// header, unreadable); From and To then span what could be read.
	From, To int64
	Whole    bool
	// Records is how many records the span held when that is known (one
	// damaged record whose header survived), else 0.
	Records int
	// Why is the damage found.
	Why error
	// Named is what the span's surviving bytes still name: an
	// allocation, a release, a registration or a claim of each may be
	// among the changes lost.
	Named Named
	// Unmatched are removals by records after the gap (before the next
	// one) of what the state did not hold: most likely put inside the
	// gap, and removed since, so nothing is owed for them.
	Unmatched Unmatched
	// After is how many records were recovered after the gap, in its
	// journal and the later ones.
	After int
}

// Named is what the surviving bytes of a Gap name, read as the journal's
// JSON text. Names that JSON escapes, or that the damage cut, are not
// listed; each list holds at most maxNamed entries.
type Named struct {
	Allocations []NamedAllocation
	Resources   []string // resource names (registrations, removals)
	Claims      []string // claim UIDs (or intent keys)
	Truncated   bool     // more were named than listed
}

// NamedAllocation is an allocation or release named in a Gap's bytes: as
// much of it as survives (fields cut by the damage are empty).
type NamedAllocation struct {
	AllocationKey
	PodNamespace string
	PodName      string
	DeviceIDs    []string
}

// Unmatched are the removals, by records after a Gap, of what the state
// did not hold.
type Unmatched struct {
	Allocations []AllocationKey
	Resources   []string
	Claims      []string
}

func (u *Unmatched) add(m unmatched) {
	u.Allocations = append(u.Allocations, m.allocations...)
	u.Resources = append(u.Resources, m.resources...)
	u.Claims = append(u.Claims, m.claims...)
}

// Pods returns the UIDs of the pods that g names or whose releases it
// explains, each once, in order.
func (g *Gap) Pods() []string {
	var out []string
	seen := map[string]bool{}
	add := func(uid string) {
		if uid != "" && !seen[uid] {
			seen[uid] = true
			out = append(out, uid)
		}
	}
	for _, a := range g.Named.Allocations {
		add(a.PodUID)
	}
	for _, k := range g.Unmatched.Allocations {
		add(k.PodUID)
	}
	return out
}

func (g *Gap) String() string {
	var sb strings.Builder
	if g.Whole {
		fmt.Fprintf(&sb, "the whole of %s (%d bytes) unusable", g.Journal, g.To)
	} else {
		fmt.Fprintf(&sb, "%s bytes %d to %d (%d bytes) unreadable", g.Journal, g.From, g.To, g.To-g.From)
	}
	if g.Records > 0 {
		fmt.Fprintf(&sb, ", %d record", g.Records)
	} else {
		sb.WriteString(", records in it unknown")
	}
	fmt.Fprintf(&sb, ", %d records recovered after it: %v", g.After, g.Why)
	for _, a := range g.Named.Allocations {
		fmt.Fprintf(&sb, "; names pod %s container %s resource %s devices %v", a.PodUID, a.ContainerName, a.ResourceName, a.DeviceIDs)
	}
	if len(g.Named.Resources) > 0 {
		fmt.Fprintf(&sb, "; names resources %v", g.Named.Resources)
	}
	if len(g.Named.Claims) > 0 {
		fmt.Fprintf(&sb, "; names claims %v", g.Named.Claims)
	}
	for _, k := range g.Unmatched.Allocations {
		fmt.Fprintf(&sb, "; pod %s container %s resource %s released after it, its allocation not found", k.PodUID, k.ContainerName, k.ResourceName)
	}
	return sb.String()
}

// maxNamed bounds each list of a Named.
const maxNamed = 64

// str matches a JSON string's contents that encoding/json writes as they
// are (no escapes, no control characters: zeros end it).
const str = `[^"\\\x00-\x1f]*`

var (
	namedAllocation = regexp.MustCompile(`"pod_uid":"(` + str + `)"(?:,"pod_namespace":"(` + str + `)")?(?:,"pod_name":"(` + str + `)")?` +
		`(?:,"container_name":"(` + str + `)")?(?:,"resource_name":"(` + str + `)")?(?:,"device_ids":\[((?:"` + str + `",?)*)\])?`)
	namedResource = regexp.MustCompile(`\{"name":"(` + str + `)","devices":`)
	namedRemoved  = regexp.MustCompile(`"removed_resources":\[((?:"` + str + `",?)*)\]`)
	namedClaim    = regexp.MustCompile(`\{"uid":"(` + str + `)"`)
	namedUIDs     = regexp.MustCompile(`"removed_claims":\[((?:"` + str + `",?)*)\]`)
	quoted        = regexp.MustCompile(`"(` + str + `)"`)
)

// nameIn reads what b, a Gap's bytes, still names.
func nameIn(b []byte) Named {
	var n Named
	for _, m := range namedAllocation.FindAllSubmatch(b, maxNamed+1) {
		if len(n.Allocations) == maxNamed {
			n.Truncated = true
			break
		}
		n.Allocations = append(n.Allocations, NamedAllocation{
			AllocationKey: AllocationKey{PodUID: string(m[1]), ContainerName: string(m[4]), ResourceName: string(m[5])},
			PodNamespace:  string(m[2]), PodName: string(m[3]), DeviceIDs: strings1(m[6]),
		})
	}
	n.Resources = n.names(namedResource, namedRemoved, b)
	n.Claims = n.names(namedClaim, namedUIDs, b)
	return n
}

// names returns the strings that one (a put) or list (a removal) matches
// in b, each once.
func (n *Named) names(one, list *regexp.Regexp, b []byte) []string {
	var out []string
	seen := map[string]bool{}
	add := func(s string) {
		if seen[s] {
			return
		}
		if len(out) == maxNamed {
			n.Truncated = true
			return
		}
		seen[s] = true
		out = append(out, s)
	}
	for _, m := range one.FindAllSubmatch(b, -1) {
		add(string(m[1]))
	}
	for _, m := range list.FindAllSubmatch(b, -1) {
		for _, s := range strings1(m[1]) {
			add(s)
		}
	}
	return out
}

// strings1 returns the quoted strings of a JSON list's contents.
func strings1(b []byte) []string {
	var out []string
	for _, m := range quoted.FindAllSubmatch(b, -1) {
		out = append(out, string(m[1]))
	}
	return out
}
