// Package claims prepares DRA ResourceClaims for pods on this node, as the
// kubelet's DRA manager (pkg/kubelet/cm/dra) does: a pod's claims are
// reserved (allocated on this node when nobody allocated them), grouped by
// driver and sent to NodePrepareResources; a claim is recorded as prepared
// only after its driver succeeded, is shared between pods by reference
// count, and is unprepared (retried until it succeeds) when the last pod
// using it is released. The records live in the dramanager's journal.
//
// This file is the contract between the parts: the Manager here, the
// Reserver (claim allocation against the node's ResourceSlices) and the
// Drivers (calls to the DRA drivers' serving instances).
package claims

import (
	"context"

	resourcev1 "k8s.io/api/resource/v1"
)

// PodRef names a pod.
type PodRef struct {
	UID       string
	Namespace string
	Name      string
}

// ClaimRef names a ResourceClaim. UID is empty when only the name is known
// (before the claim was read from the API).
type ClaimRef struct {
	Namespace string
	Name      string
	UID       string
}

// Device is one device of a prepared claim, as its driver answered for it.
type Device struct {
	// Requests are the claim's request names the device serves
	// ("<request>" or "<request>/<subrequest>").
	Requests     []string
	Driver       string
	Pool         string
	Device       string
	CDIDeviceIDs []string
}

// PrepareResult is a driver's answer for one claim: its devices, or the
// driver's error for that claim.
type PrepareResult struct {
	Devices []Device
	Err     error
}

// Reserver reserves claims for pods against the API holding them.
type Reserver interface {
	// Reserve reads the claim, allocates it on this node when it has no
	// allocation (structured allocator, this node's slices and the
	// DeviceClasses), adds pod to status.reservedFor and returns the claim
	// as written. A claim allocated to another node, or that cannot be
	// allocated, is errdefs.ErrFailedPrecondition with the reason; a
	// missing claim errdefs.ErrNotFound.
	Reserve(ctx context.Context, pod PodRef, claim ClaimRef) (*resourcev1.ResourceClaim, error)
	// Unreserve removes pod from the claim's status.reservedFor and, when
	// this node allocated it and no pod reserves it any longer, removes
	// the allocation. A claim that is gone, or whose UID differs from
	// claim.UID, is success (nothing of ours is left to undo).
	Unreserve(ctx context.Context, pod PodRef, claim ClaimRef) error
}

// Drivers calls the serving instance of a DRA driver (45 s a call).
type Drivers interface {
	// Prepare calls NodePrepareResources with claims (UIDs set) and returns
	// the per-claim results by claim UID. The error is for the call as a
	// whole: a driver that is not registered is errdefs.ErrUnavailable
	// naming it.
	Prepare(ctx context.Context, driver string, claims []ClaimRef) (map[string]PrepareResult, error)
	// Unprepare calls NodeUnprepareResources; per-claim errors by claim UID.
	Unprepare(ctx context.Context, driver string, claims []ClaimRef) (map[string]error, error)
}

// PodClaim is one entry of a pod spec's resourceClaims: the name the
// containers use and the ResourceClaim it stands for (in the pod's
// namespace).
type PodClaim struct {
	Name              string
	ResourceClaimName string
}

// ContainerClaim is one entry of a container's resources.claims: a pod
// claim's name and, optionally, one of its requests.
type ContainerClaim struct {
	Name    string
	Request string
}

// ContainerClaims are the claims one container uses.
type ContainerClaims struct {
	Container string
	Claims    []ContainerClaim
}

// PrepareRequest prepares a pod's claims.
type PrepareRequest struct {
	Pod        PodRef
	PodClaims  []PodClaim
	Containers []ContainerClaims
}

// ClaimDevice is a device of a claim, with the claim it belongs to.
type ClaimDevice struct {
	Claim ClaimRef
	Device
}

// ContainerResult is what one container gets: the CDI device IDs of the
// claims and requests it references, and those devices.
type ContainerResult struct {
	Container    string
	CDIDeviceIDs []string
	Devices      []ClaimDevice
}

// State is where a claim recorded on this node stands.
type State int

const (
	// StatePrepared: the driver prepared it; pods use it.
	StatePrepared State = iota + 1
	// StateUnpreparing: its last pod was released; NodeUnprepareResources
	// is owed and retried until it succeeds.
	StateUnpreparing
)

// Claim is a claim recorded on this node.
type Claim struct {
	Ref     ClaimRef
	Driver  string
	State   State
	Devices []Device
	// Pods are the UIDs of the pods using it.
	Pods []string
	// AllocatedHere is set when this node allocated it (it is deallocated
	// when its last pod goes).
	AllocatedHere bool
	// LastError is the last failed unprepare's error, if any.
	LastError string
}
