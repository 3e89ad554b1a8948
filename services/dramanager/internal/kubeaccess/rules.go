package kubeaccess

// Rule is one permission the dramanager needs on a cluster's API: a verb
// on a resource (or one of its subresources) of an API group, in every
// namespace for a namespaced resource.
type Rule struct {
	Verb        string
	Group       string // "" is the core group
	Resource    string
	Subresource string
	// Why names the code that makes the call.
	Why string
	// Without says what fails while the rule is missing.
	Without string
}

// Path is the resource as RBAC and the API's messages name it:
// resource[/subresource].
func (r Rule) Path() string {
	if r.Subresource == "" {
		return r.Resource
	}
	return r.Resource + "/" + r.Subresource
}

// String is the rule as the logs and errors name it, e.g.
// "update resourceclaims/binding (resource.k8s.io)".
func (r Rule) String() string {
	return r.Verb + " " + r.Path() + " (" + groupName(r.Group) + ")"
}

func groupName(g string) string {
	if g == "" {
		return "core"
	}
	return g
}

const resourceGroup = "resource.k8s.io"

// What fails without a rule: the start check logs it.
const (
	claimsFail     = "claims will fail: "
	informersStall = "the informers never sync: every allocation lists all it reads from the API (slower; client-go logs its retries)"
	slicesStall    = informersStall + "; WatchResourceSlices waits and fails"
)

// Required is every permission the dramanager needs in cluster mode
// (--kubeconfig), the least that lets it work: deploy/rbac/nodeplug.yaml
// grants exactly these (TestManifestGrantsRequired), docs/dra-drivers.md
// lists them (TestDocsListRequired) and the start check asks the API for
// each (Check).
//
// Left out on purpose:
//   - create on selfsubjectreviews (authentication.k8s.io) and
//     selfsubjectaccessreviews (authorization.k8s.io), which the start
//     check makes: every authenticated user holds them (the system:basic-user
//     ClusterRole);
//   - get on namespaces, which an explanation of a refused admin-access
//     claim reads (claimalloc/explain.go) and does without: a cluster's
//     API server refuses such a claim when it is created;
//   - delete on resourceslices: the wipe is one DeleteCollection, which
//     the API authorizes as deletecollection alone.
//
// Nodes, slices and classes are cluster-scoped; claims are read and
// written in every namespace, and resourceclaims/binding is checked by
// the API server cluster-wide whatever the claim's namespace: the rules
// need a ClusterRole bound by a ClusterRoleBinding.
var Required = []Rule{
	{Verb: "get", Resource: "nodes",
		Why:     "claimalloc reads this node's Node for an allocation (inputs.go, cache.go) when the informer does not hold it",
		Without: claimsFail + "an allocation cannot read the Node"},
	{Verb: "list", Resource: "nodes",
		Why: "kubecache's Node informer (field selector metadata.name)", Without: informersStall},
	{Verb: "watch", Resource: "nodes",
		Why: "kubecache's Node informer", Without: informersStall},

	{Verb: "list", Group: resourceGroup, Resource: "resourceslices",
		Why:     "kubecache's slice informers (this node's, and those of no one node); claimalloc's reads without them; ListResourceSlices (slicewatch); the drivers' sweep at start and the count before a wipe (drivers/wipe.go)",
		Without: claimsFail + "no allocation can read the slices; " + slicesStall + "; ListResourceSlices fails"},
	{Verb: "watch", Group: resourceGroup, Resource: "resourceslices",
		Why: "kubecache's slice informers", Without: slicesStall},
	{Verb: "deletecollection", Group: resourceGroup, Resource: "resourceslices",
		Why:     "the wipe of the slices of a driver that stayed away (drivers/wipe.go: one DeleteCollection by spec.nodeName and spec.driver)",
		Without: "a gone driver's ResourceSlices stay in the API, offering devices nobody serves"},

	{Verb: "list", Group: resourceGroup, Resource: "deviceclasses",
		Why: "kubecache's DeviceClass informer; claimalloc's reads without it", Without: claimsFail + "no allocation can read the DeviceClasses"},
	{Verb: "watch", Group: resourceGroup, Resource: "deviceclasses",
		Why: "kubecache's DeviceClass informer", Without: informersStall},

	{Verb: "get", Group: resourceGroup, Resource: "resourceclaims",
		Why: "claimalloc reads each claim it reserves or unreserves (allocator.go)", Without: claimsFail + "no claim can be read"},
	{Verb: "list", Group: resourceGroup, Resource: "resourceclaims",
		Why: "kubecache's claim informer (the devices in use); claimalloc's reads without it; ListClaims (claimview)", Without: claimsFail + "the devices in use cannot be read; ListClaims fails"},
	{Verb: "watch", Group: resourceGroup, Resource: "resourceclaims",
		Why: "kubecache's claim informer", Without: informersStall},
	{Verb: "update", Group: resourceGroup, Resource: "resourceclaims",
		Why:     "claimalloc writes and removes the nodeplug.io/allocated-by-node annotation of a claim it allocates (allocator.go)",
		Without: claimsFail + "a claim not yet allocated cannot be marked as this node's"},
	{Verb: "update", Group: resourceGroup, Resource: "resourceclaims", Subresource: "status",
		Why: "claimalloc writes status.allocation and status.reservedFor (allocator.go: UpdateStatus)", Without: claimsFail + "no claim can be allocated, reserved or released"},
	{Verb: "update", Group: resourceGroup, Resource: "resourceclaims", Subresource: "binding",
		Why:     "kube-apiserver (1.36 and later, DRAResourceClaimGranularStatusAuthorization) asks for it, cluster-wide, on any change of status.allocation or status.reservedFor",
		Without: claimsFail + "every status write is refused with 422 naming resourceclaims/binding"},
}
