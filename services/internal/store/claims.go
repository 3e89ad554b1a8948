// This file is the record kind of prepared DRA claims (package claims):
// one record per ResourceClaim recorded on this node, keyed by the
// claim's UID, in the same state, journal and group commit as the
// resources and allocations. Every change of a claim (prepared, a pod
// added, a pod released with its reservation owed, unprepare owed, gone)
// is the claim's whole record put again, or its removal; a snapshot
// carries them under "claims", a journal record under "claims" and
// "removed_claims". Files written before this kind existed have neither
// and load with no claims.
//
// The same kind carries the intents of reservations (ClaimIntent): put
// before a pod's reservation of a claim is written to the API, removed in
// the commit that records the prepare or its rollback. Their key is
// IntentKey's, which no claim UID can equal; files written before intents
// existed simply hold none.

package store

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
)

// Claim states as recorded.
const (
	// ClaimPrepared: every driver of the claim prepared it.
	ClaimPrepared = "prepared"
	// ClaimUnpreparing: its last pod was released; NodeUnprepareResources
	// is owed.
	ClaimUnpreparing = "unpreparing"
	// ClaimIntent is not a claim prepared here but an intent: the pod of
	// Pods is being reserved the claim Namespace/Name (ClaimUID, once
	// read), and Drivers, once set, are being asked to prepare it. A
	// restart that finds one owes what a failed prepare does: unprepare
	// when Drivers are set, then remove the pod from the claim's
	// reservations (which deallocates what this node allocated).
	ClaimIntent = "intent"
)

// IntentKey is the key (Claim.UID) of the intent of the pod podUID to
// reserve the claim namespace/name. Namespaces and names hold no "/", so
// keys of different intents differ; claim UIDs never start "intent/".
func IntentKey(podUID, namespace, name string) string {
	return "intent/" + podUID + "/" + namespace + "/" + name
}

// Claim is a ResourceClaim recorded on this node, or an intent
// (ClaimIntent).
type Claim struct {
	// UID is the claim's UID; an intent's IntentKey.
	UID       string `json:"uid"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Drivers are the drivers of its devices, each prepared.
	Drivers []string      `json:"drivers"`
	State   string        `json:"state"`
	Devices []ClaimDevice `json:"devices"`
	// Pods use it.
	Pods []ClaimPod `json:"pods"`
	// Released pods no longer use it; removing them from the claim's
	// status.reservedFor is still owed.
	Released []ClaimPod `json:"released,omitempty"`
	// AllocatedHere: this node allocated it (and deallocates it after
	// its last pod).
	AllocatedHere bool `json:"allocated_here,omitempty"`
	// ClaimUID is an intent's claim UID: empty until the claim was read
	// (the pod's UID in its reservations then says what is ours).
	ClaimUID string `json:"claim_uid,omitempty"`
}

// ClaimDevice is a device of a prepared claim, as its driver answered.
type ClaimDevice struct {
	Requests     []string `json:"requests"`
	Driver       string   `json:"driver"`
	Pool         string   `json:"pool"`
	Device       string   `json:"device"`
	CDIDeviceIDs []string `json:"cdi_device_ids,omitempty"`
}

// ClaimPod names a pod of a claim, with the containers that use it.
type ClaimPod struct {
	UID       string `json:"uid"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Containers are the pod's containers' references to the claim.
	Containers []ClaimUse `json:"containers,omitempty"`
}

// ClaimUse is a container's reference to a claim: the whole claim, or one
// of its requests.
type ClaimUse struct {
	Container string `json:"container"`
	Request   string `json:"request,omitempty"`
}

// putClaim records the encoding of a claim, found by its UID.
func (s *state) putClaim(raw []byte) error {
	var c struct {
		UID string `json:"uid"`
	}
	if err := json.Unmarshal(raw, &c); err != nil || c.UID == "" {
		return fmt.Errorf("%w: a claim record without a UID: %v", ErrCorrupt, err)
	}
	s.claims[c.UID] = raw
	return nil
}

// claimsData decodes the claim records, sorted by UID.
func (s *state) claimsData() ([]Claim, error) {
	out := make([]Claim, 0, len(s.claims))
	for _, uid := range slices.Sorted(maps.Keys(s.claims)) {
		var c Claim
		if err := json.Unmarshal(s.claims[uid], &c); err != nil {
			return nil, fmt.Errorf("%w: claim %s: %v", ErrCorrupt, uid, err)
		}
		out = append(out, c)
	}
	return out, nil
}

// encodeClaims encodes the claims put by b.
func encodeClaims(b *Batch) ([][]byte, error) {
	out := make([][]byte, len(b.Claims))
	for i := range b.Claims {
		if b.Claims[i].UID == "" {
			return nil, fmt.Errorf("encode claim %s/%s: no UID", b.Claims[i].Namespace, b.Claims[i].Name)
		}
		enc, err := json.Marshal(&b.Claims[i])
		if err != nil {
			return nil, fmt.Errorf("encode claim %s: %w", b.Claims[i].UID, err)
		}
		out[i] = enc
	}
	return out, nil
}

// appendClaims appends the claims' fields of a journal record to p, which
// holds at least "{".
func appendClaims(p []byte, claims [][]byte, removed []string) ([]byte, error) {
	if len(claims) > 0 {
		if len(p) > 1 {
			p = append(p, ',')
		}
		p = append(p, `"claims":[`...)
		p = appendJoined(p, claims)
		p = append(p, ']')
	}
	if len(removed) > 0 {
		if len(p) > 1 {
			p = append(p, ',')
		}
		uids, err := json.Marshal(removed)
		if err != nil {
			return nil, err
		}
		p = append(p, `"removed_claims":`...)
		p = append(p, uids...)
	}
	return p, nil
}

// appendSnapshotClaims appends the snapshot's claims field, sorted.
func appendSnapshotClaims(data []byte, s *state) []byte {
	if len(s.claims) == 0 {
		return data
	}
	data = append(data, `,"claims":[`...)
	for i, uid := range slices.Sorted(maps.Keys(s.claims)) {
		if i > 0 {
			data = append(data, ',')
		}
		data = append(data, s.claims[uid]...)
	}
	return append(data, ']')
}
