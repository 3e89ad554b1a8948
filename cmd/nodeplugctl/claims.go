package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
)

const prepareArgs = "--pod-uid UID --namespace NS --name POD --claim PODCLAIM=CLAIM... --container NAME=PODCLAIM[/REQUEST]... [-o table|json]"

// cmdClaims lists the claims that concern this node (the dramanager
// decides which: ListClaims), or with --all every claim of the API, with
// the node each is allocated to.
func cmdClaims(ctx context.Context, c *cli, args []string) error {
	var namespace string
	var all bool
	return listCommand(ctx, c, "claims", args, dramanagerSvc, func(ctx context.Context, _ *flag.FlagSet) (*dmv1.ListClaimsResponse, error) {
		cc, err := c.conn(dramanagerSvc)
		if err != nil {
			return nil, err
		}
		return dmv1.NewDRAServiceClient(cc).ListClaims(ctx, &dmv1.ListClaimsRequest{Namespace: namespace, All: all})
	}, func(w io.Writer, now time.Time, resp *dmv1.ListClaimsResponse) error {
		return renderClaims(w, now, resp, all)
	}, func(fs *flag.FlagSet) {
		fs.StringVar(&namespace, "namespace", "", "only this namespace's claims")
		fs.BoolVar(&all, "all", false, "also the claims that do not concern this node (with a cluster: every claim of the API), with a NODE column: the node each is allocated to")
	})
}

// claimState is a claim state's name in tables: "prepared", "failed".
func claimState(s dmv1.ClaimState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "CLAIM_STATE_"))
}

func joinOrDash(items []string) string {
	if len(items) == 0 {
		return "-"
	}
	return strings.Join(items, ",")
}

// renderClaims prints one row per claim: its state, drivers, devices
// (pool/device), their health (device=health, with the driver's message
// in parentheses), pods (names, else UIDs), CDI IDs and the reason; with
// all (--all), the node it is allocated to after its state.
func renderClaims(w io.Writer, _ time.Time, resp *dmv1.ListClaimsResponse, all bool) error {
	if len(resp.GetClaims()) == 0 {
		msg := "no ResourceClaims concern this node (--all lists every one)"
		if all {
			msg = "no ResourceClaims"
		}
		_, err := fmt.Fprintln(w, msg)
		return err
	}
	tw := newTable(w)
	node := ""
	if all {
		node = "NODE\t"
	}
	fmt.Fprintln(tw, "CLAIM\tSTATE\t"+node+"DRIVER\tDEVICES\tHEALTH\tPODS\tCDI IDS\tREASON")
	for _, cl := range resp.GetClaims() {
		var drivers, devices, health, pods []string
		for _, d := range cl.GetDevices() {
			if !slices.Contains(drivers, d.GetDriver()) {
				drivers = append(drivers, d.GetDriver())
			}
			devices = append(devices, d.GetPool()+"/"+d.GetDevice())
			if h := d.GetHealth(); h != "" {
				if m := d.GetHealthMessage(); m != "" {
					h += " (" + m + ")"
				}
				health = append(health, d.GetDevice()+"="+h)
			}
		}
		for _, p := range cl.GetPods() {
			pods = append(pods, cmpOr(p.GetName(), p.GetUid()))
		}
		if all {
			node = dash(cl.GetAllocatedNode()) + "\t"
		}
		fmt.Fprintf(tw, "%s/%s\t%s\t%s%s\t%s\t%s\t%s\t%s\t%s\n", cl.GetNamespace(), cl.GetName(), claimState(cl.GetState()), node,
			joinOrDash(drivers), joinOrDash(devices), joinOrDash(health), joinOrDash(pods), joinOrDash(cl.GetCdiDeviceIds()), dash(cl.GetReason()))
	}
	return tw.Flush()
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// parsePrepare builds the request from --claim PODCLAIM=CLAIM and
// --container NAME=PODCLAIM[/REQUEST] (a container named more than once
// uses each claim given); every container claim must name a --claim.
func parsePrepare(uid, namespace, name string, podClaims, containers []string) (*dmv1.PrepareResourcesRequest, error) {
	if uid == "" || namespace == "" || name == "" {
		return nil, usagef("--pod-uid, --namespace and --name are required")
	}
	req := &dmv1.PrepareResourcesRequest{PodUid: uid, PodNamespace: namespace, PodName: name}
	for _, pc := range podClaims {
		k, v, ok := strings.Cut(pc, "=")
		if !ok || k == "" || v == "" {
			return nil, usagef("--claim %q: want PODCLAIM=CLAIM (the pod's name for the claim, then the ResourceClaim's name)", pc)
		}
		if slices.ContainsFunc(req.PodClaims, func(x *dmv1.PodClaim) bool { return x.GetName() == k }) {
			return nil, usagef("--claim %q: pod claim %q given twice", pc, k)
		}
		req.PodClaims = append(req.PodClaims, &dmv1.PodClaim{Name: k, ResourceClaimName: v})
	}
	if len(req.PodClaims) == 0 {
		return nil, usagef("at least one --claim PODCLAIM=CLAIM is required")
	}
	for _, ct := range containers {
		cname, ref, ok := strings.Cut(ct, "=")
		if !ok || cname == "" || ref == "" {
			return nil, usagef("--container %q: want NAME=PODCLAIM[/REQUEST]", ct)
		}
		claim, request, _ := strings.Cut(ref, "/")
		if !slices.ContainsFunc(req.PodClaims, func(x *dmv1.PodClaim) bool { return x.GetName() == claim }) {
			return nil, usagef("--container %q: pod claim %q is not given with --claim", ct, claim)
		}
		i := slices.IndexFunc(req.Containers, func(x *dmv1.ContainerClaims) bool { return x.GetName() == cname })
		if i < 0 {
			req.Containers = append(req.Containers, &dmv1.ContainerClaims{Name: cname})
			i = len(req.Containers) - 1
		}
		req.Containers[i].Claims = append(req.Containers[i].Claims, &dmv1.ContainerClaim{Name: claim, Request: request})
	}
	if len(req.Containers) == 0 {
		return nil, usagef("at least one --container NAME=PODCLAIM[/REQUEST] is required")
	}
	return req, nil
}

func cmdPrepare(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("prepare", prepareArgs)
	out := c.outputFlag(fs, "table", "json")
	uid := fs.String("pod-uid", "", "pod UID (required)")
	namespace := fs.String("namespace", "", "the pod's namespace, also its claims' (required)")
	name := fs.String("name", "", "the pod's name (required)")
	var podClaims, containers stringList
	fs.Var(&podClaims, "claim", "a pod claim, PODCLAIM=CLAIM: the name the containers use, then the ResourceClaim's (repeatable)")
	fs.Var(&containers, "container", "a container's claim, NAME=PODCLAIM[/REQUEST] (repeatable)")
	if err := noArgs(fs, args); err != nil {
		return err
	}
	if err := checkOutput(*out, "table", "json"); err != nil {
		return err
	}
	req, err := parsePrepare(*uid, *namespace, *name, podClaims, containers)
	if err != nil {
		return err
	}
	resp, err := serviceCall(ctx, c, dramanagerSvc, fmt.Sprintf("prepare the claims of pod %s/%s (%s)", *namespace, *name, *uid),
		func(ctx context.Context, cc *grpc.ClientConn) (*dmv1.PrepareResourcesResponse, error) {
			return dmv1.NewDRAServiceClient(cc).PrepareResources(ctx, req)
		})
	if err != nil {
		return err
	}
	if *out == "json" {
		return writeJSON(c.stdout, resp)
	}
	return renderPrepared(c.stdout, resp)
}

// renderPrepared prints one row per container: its CDI device IDs and the
// devices they come from (claim: driver pool/device).
func renderPrepared(w io.Writer, resp *dmv1.PrepareResourcesResponse) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "CONTAINER\tCDI DEVICE IDS\tDEVICES")
	for _, ct := range resp.GetContainers() {
		var devs []string
		for _, d := range ct.GetDevices() {
			devs = append(devs, fmt.Sprintf("%s/%s:%s:%s/%s", d.GetClaimNamespace(), d.GetClaimName(), d.GetDriver(), d.GetPool(), d.GetDevice()))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", ct.GetName(), joinOrDash(ct.GetCdiDeviceIds()), joinOrDash(devs))
	}
	return tw.Flush()
}
