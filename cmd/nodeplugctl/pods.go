package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/nodeplug/nodeplug/pkg/podinfo"
)

// The commands that read the pods of the node-local API, what the
// dramanager's pod worker made of them (their claims, devices, status)
// and their events: pods, events and describe pod.

const (
	podsArgs     = "[-n NS | -A] [-o table|json|yaml] [--kubeconfig PATH]"
	eventsArgs   = "[--for [NS/]NAME] [-n NS] [-o table|json|yaml] [--kubeconfig PATH]"
	describeArgs = "pod NS/NAME | pod NAME [-n NS] [-o text|json|yaml] [--kubeconfig PATH]"
)

const readKubeconfigUsage = "the API's kubeconfig (default <root-dir>/nodeplug/kubeconfig-operator; reading needs only the reader's, <root-dir>/nodeplug/kubeconfig-reader)"

// readClient is a client of the node-local API with the kubeconfig given,
// else the operator's under the root dir; and the API's address.
func (c *cli) readClient(kubeconfig string) (kubernetes.Interface, string, error) {
	cfg, kubeconfig, err := c.apiConfig(kubeconfig)
	if err != nil {
		return nil, "", err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	return cs, cfg.Host, nil
}

// namespaceGiven says whether -n or --namespace is on the command line.
func namespaceGiven(fs *flag.FlagSet) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "namespace" || f.Name == "n" })
	return given
}

func cmdPods(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("pods", podsArgs)
	out := c.outputFlag(fs, "table", "json", "yaml")
	kubeconfig := fs.String("kubeconfig", "", readKubeconfigUsage)
	namespace := fs.String("namespace", "", "only this namespace's pods (default: every namespace's)")
	fs.StringVar(namespace, "n", "", "same as --namespace")
	all := fs.Bool("all-namespaces", false, "every namespace's pods (the default)")
	fs.BoolVar(all, "A", false, "same as --all-namespaces")
	if err := noArgs(fs, args); err != nil {
		return err
	}
	if err := checkOutput(*out, "table", "json", "yaml"); err != nil {
		return err
	}
	if *all && namespaceGiven(fs) {
		return usagef("-n %s and -A: give one (with neither, every namespace's pods are listed)", *namespace)
	}
	cs, host, err := c.readClient(*kubeconfig)
	if err != nil {
		return err
	}
	ns := *namespace
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list pods%s at %s: %w", inNamespaceOf(ns), host, err)
	}
	slices.SortFunc(pods.Items, func(a, b corev1.Pod) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	if *out != "table" {
		pods.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "PodList"}
		return writeObject(c.stdout, *out, pods)
	}
	if len(pods.Items) == 0 {
		_, err := fmt.Fprintf(c.stdout, "no pods%s\n", inNamespaceOf(ns))
		return err
	}
	claims, err := cs.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list the pods' ResourceClaims%s at %s: %w", inNamespaceOf(ns), host, err)
	}
	events, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Pod"})
	if err != nil {
		return fmt.Errorf("list the pods' events%s at %s: %w", inNamespaceOf(ns), host, err)
	}
	return renderPods(c.stdout, now(), pods.Items, claims.Items, events.Items)
}

func inNamespaceOf(ns string) string {
	if ns == "" {
		return ""
	}
	return " in namespace " + ns
}

// renderPods prints one row per pod: its phase, its containers (ready of
// all, and why they are not running), its claims (pod claim=ResourceClaim),
// the devices allocated to them (driver/pool/device), its age and the
// reason of its latest event.
func renderPods(w io.Writer, now time.Time, pods []corev1.Pod, claims []resourcev1.ResourceClaim, events []corev1.Event) error {
	byName := map[string]*resourcev1.ResourceClaim{}
	for i := range claims {
		byName[claims[i].Namespace+"/"+claims[i].Name] = &claims[i]
	}
	podsByName := map[string]*corev1.Pod{}
	for i := range pods {
		podsByName[pods[i].Namespace+"/"+pods[i].Name] = &pods[i]
	}
	latest := map[*corev1.Pod]*corev1.Event{}
	for i := range events {
		e := &events[i]
		p := podsByName[e.InvolvedObject.Namespace+"/"+e.InvolvedObject.Name]
		if p == nil || !podinfo.EventOf(e, p) {
			continue
		}
		if prev := latest[p]; prev == nil || podinfo.CompareEvents(prev, e) < 0 {
			latest[p] = e
		}
	}
	return writeTable(w, func(tw io.Writer) {
		fmt.Fprintln(tw, "NAMESPACE\tNAME\tPHASE\tREADY\tCLAIMS\tDEVICES\tAGE\tLAST EVENT")
		for i := range pods {
			p := &pods[i]
			var refs, devices []string
			for _, r := range podinfo.ClaimRefs(p) {
				refs = append(refs, r.Name+"="+dash(r.Claim))
				if cl := byName[p.Namespace+"/"+r.Claim]; cl != nil && r.Claim != "" {
					devices = append(devices, claimDevices(cl)...)
				}
			}
			last := ""
			if e := latest[p]; e != nil {
				last = e.Reason
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Namespace, p.Name, dash(string(p.Status.Phase)), containerSummary(p),
				joinOrDash(refs), joinOrDash(devices), since(now, p.CreationTimestamp.Time), last)
		}
	})
}

// containerSummary is how many of the pod's containers are ready, of
// all, then what their states say: each reason a container waits or
// ended with (an init container's after "Init:"), or Running.
func containerSummary(p *corev1.Pod) string {
	ready := 0
	var states []string
	add := func(s string) {
		if !slices.Contains(states, s) {
			states = append(states, s)
		}
	}
	for _, s := range p.Status.InitContainerStatuses {
		if w := s.State.Waiting; w != nil {
			add("Init:" + cmp.Or(w.Reason, "Waiting"))
		}
	}
	for _, s := range p.Status.ContainerStatuses {
		if s.Ready {
			ready++
		}
		switch {
		case s.State.Waiting != nil:
			add(cmp.Or(s.State.Waiting.Reason, "Waiting"))
		case s.State.Terminated != nil:
			add(cmp.Or(s.State.Terminated.Reason, "Terminated"))
		case s.State.Running != nil:
			add("Running")
		}
	}
	out := fmt.Sprintf("%d/%d", ready, len(p.Spec.Containers))
	if len(states) > 0 {
		out += " " + strings.Join(states, ",")
	}
	return out
}

// claimDevices are the devices allocated to a claim, as driver/pool/device.
func claimDevices(cl *resourcev1.ResourceClaim) []string {
	if cl.Status.Allocation == nil {
		return nil
	}
	var out []string
	for _, r := range cl.Status.Allocation.Devices.Results {
		out = append(out, r.Driver+"/"+r.Pool+"/"+r.Device)
	}
	return out
}

// since renders the time from t to now as kubectl's AGE does: 5s, 3m, 2h,
// 4d, 2y (whole units, rounded down); "-" for an unset time, "0s" for one
// after now (another clock's).
func since(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", max(0, int(d/time.Second)))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	case d < 365*24*time.Hour:
		return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
	default:
		return fmt.Sprintf("%dy", int(d/(365*24*time.Hour)))
	}
}

// podEventsSelector is the field selector of a pod's events.
func podEventsSelector(namespace, name string) string {
	return "involvedObject.kind=Pod,involvedObject.namespace=" + fields.EscapeValue(namespace) +
		",involvedObject.name=" + fields.EscapeValue(name)
}

// splitPodRef reads NS/NAME, or NAME in namespace; a namespace given both
// ways (explicit: -n on the command line) must be the same.
func splitPodRef(ref, namespace string, explicit bool) (string, string, error) {
	ns, name, hasNS := strings.Cut(ref, "/")
	if !hasNS {
		ns, name = namespace, ref
	}
	switch {
	case name == "" || strings.Contains(name, "/") || (hasNS && ns == ""):
		return "", "", usagef("%q: want NAME or NAMESPACE/NAME", ref)
	case hasNS && explicit && ns != namespace:
		return "", "", usagef("pod %s is in namespace %s, not --namespace %s", ref, ns, namespace)
	}
	return ns, name, nil
}

func cmdEvents(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("events", eventsArgs)
	out := c.outputFlag(fs, "table", "json", "yaml")
	kubeconfig := fs.String("kubeconfig", "", readKubeconfigUsage)
	namespace := fs.String("namespace", "", "only this namespace's events (default: every namespace's); with --for NAME, the pod's namespace (there, default: the namespace default)")
	fs.StringVar(namespace, "n", "", "same as --namespace")
	forPod := fs.String("for", "", "only the events of this pod: NS/NAME, or NAME in --namespace")
	if err := noArgs(fs, args); err != nil {
		return err
	}
	if err := checkOutput(*out, "table", "json", "yaml"); err != nil {
		return err
	}
	ns := *namespace
	var opts metav1.ListOptions
	what := "events" + inNamespaceOf(ns)
	if *forPod != "" {
		pns, name, err := splitPodRef(*forPod, cmp.Or(ns, metav1.NamespaceDefault), namespaceGiven(fs))
		if err != nil {
			return err
		}
		ns, opts.FieldSelector = pns, podEventsSelector(pns, name)
		what = "events of pod " + pns + "/" + name
	}
	cs, host, err := c.readClient(*kubeconfig)
	if err != nil {
		return err
	}
	events, err := cs.CoreV1().Events(ns).List(ctx, opts)
	if err != nil {
		return fmt.Errorf("list %s at %s: %w", what, host, err)
	}
	podinfo.SortEvents(events.Items)
	if *out != "table" {
		events.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "EventList"}
		return writeObject(c.stdout, *out, events)
	}
	if len(events.Items) == 0 {
		_, err := fmt.Fprintf(c.stdout, "no %s\n", what)
		return err
	}
	return writeTable(c.stdout, func(tw io.Writer) { eventRows(tw, "", now(), events.Items, ns == "") })
}

// eventRows prints events, each line after prefix, as kubectl events
// does: LAST SEEN (with how many times since when, for one that
// occurred more than once), TYPE, REASON, OBJECT, MESSAGE; after a
// NAMESPACE with withNamespace.
func eventRows(tw io.Writer, prefix string, now time.Time, events []corev1.Event, withNamespace bool) {
	nsCol := ""
	if withNamespace {
		nsCol = "NAMESPACE\t"
	}
	fmt.Fprintf(tw, "%s%sLAST SEEN\tTYPE\tREASON\tOBJECT\tMESSAGE\n", prefix, nsCol)
	for i := range events {
		e := &events[i]
		seen := since(now, podinfo.EventLast(e))
		if n := podinfo.EventCount(e); n > 1 {
			seen += fmt.Sprintf(" (x%d over %s)", n, since(now, podinfo.EventFirst(e)))
		}
		if withNamespace {
			nsCol = e.Namespace + "\t"
		}
		obj := e.InvolvedObject.Name
		if k := e.InvolvedObject.Kind; k != "" {
			obj = strings.ToLower(k) + "/" + obj
		}
		fmt.Fprintf(tw, "%s%s%s\t%s\t%s\t%s\t%s\n", prefix, nsCol, seen, dash(e.Type), dash(e.Reason), obj, oneLine(e.Message))
	}
}

// oneLine is s on one line of a table.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// writeTable prints what table writes, its columns aligned, without the
// spaces an empty last column leaves at the end of a line.
func writeTable(w io.Writer, table func(tw io.Writer)) error {
	var b bytes.Buffer
	tw := newTable(&b)
	table(tw)
	if err := tw.Flush(); err != nil {
		return err
	}
	var out strings.Builder
	for line := range strings.Lines(b.String()) {
		out.WriteString(strings.TrimRight(line, " \n"))
		out.WriteByte('\n')
	}
	_, err := io.WriteString(w, out.String())
	return err
}

// writeObject prints a Kubernetes object as JSON (indented as kubectl
// indents it) or YAML.
func writeObject(w io.Writer, format string, obj any) error {
	var b []byte
	var err error
	if format == "yaml" {
		b, err = sigsyaml.Marshal(obj)
	} else {
		b, err = json.MarshalIndent(obj, "", "    ")
		b = append(b, '\n')
	}
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// parseDescribe reads what describe names: pod NS/NAME, pod NAME or
// pod/NAME (in namespace, explicit when given with -n).
func parseDescribe(pos []string, namespace string, explicit bool) (string, string, error) {
	var kind, ref string
	switch {
	case len(pos) == 1 && strings.Contains(pos[0], "/"):
		kind, ref, _ = strings.Cut(pos[0], "/")
		if strings.Contains(ref, "/") {
			return "", "", usagef("%q: want pod/NAME (with --namespace for the namespace) or pod NS/NAME", pos[0])
		}
	case len(pos) == 2:
		kind, ref = pos[0], pos[1]
	case len(pos) == 0:
		return "", "", usagef("name the pod: describe pod NS/NAME")
	case len(pos) == 1:
		return "", "", usagef("name the %s: describe %s NS/NAME", pos[0], pos[0])
	default:
		return "", "", usagef("describe one pod at a time: unexpected arguments %q", pos[2:])
	}
	if k := kindNamed(kind); k == nil || k.gvk.Kind != "Pod" {
		return "", "", usagef("describe takes pods (pod, pods, po), not %q", kind)
	}
	return splitPodRef(ref, namespace, explicit)
}

func cmdDescribe(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("describe", describeArgs)
	out := c.outputFlag(fs, "text", "json", "yaml")
	kubeconfig := fs.String("kubeconfig", "", readKubeconfigUsage)
	namespace := fs.String("namespace", metav1.NamespaceDefault, "the pod's namespace when NAME names none")
	fs.StringVar(namespace, "n", metav1.NamespaceDefault, "same as --namespace")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if err := checkOutput(*out, "text", "json", "yaml"); err != nil {
		return err
	}
	ns, name, err := parseDescribe(pos, *namespace, namespaceGiven(fs))
	if err != nil {
		return err
	}
	cs, host, err := c.readClient(*kubeconfig)
	if err != nil {
		return err
	}
	pod, err := getPod(ctx, cs, host, ns, name)
	if err != nil {
		return err
	}
	if *out != "text" {
		pod.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}
		return writeObject(c.stdout, *out, pod)
	}
	claims := map[string]*resourcev1.ResourceClaim{}
	for _, r := range podinfo.ClaimRefs(pod) {
		if r.Claim == "" || claims[r.Claim] != nil {
			continue
		}
		cl, err := cs.ResourceV1().ResourceClaims(ns).Get(ctx, r.Claim, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return fmt.Errorf("get ResourceClaim %s/%s of pod %s/%s at %s: %w", ns, r.Claim, ns, name, host, err)
		}
		claims[r.Claim] = cl
	}
	events, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: podEventsSelector(ns, name)})
	if err != nil {
		return fmt.Errorf("list the events of pod %s/%s at %s: %w", ns, name, host, err)
	}
	mine := slices.DeleteFunc(events.Items, func(e corev1.Event) bool { return !podinfo.EventOf(&e, pod) })
	podinfo.SortEvents(mine)
	return renderPodDescription(c.stdout, now(), pod, claims, mine)
}

const (
	none       = "<none>"
	timeLayout = "Mon, 02 Jan 2006 15:04:05 -0700" // as kubectl describe writes times
)

func orNone(s string) string {
	if s == "" {
		return none
	}
	return s
}

// renderPodDescription prints a pod as kubectl describe pod does: what it
// is and where it runs, its conditions, its containers with their states
// and claims, its claims with their allocations, then its events.
func renderPodDescription(w io.Writer, now time.Time, p *corev1.Pod, claims map[string]*resourcev1.ResourceClaim, events []corev1.Event) error {
	refs := podinfo.ClaimRefs(p)
	return writeTable(w, func(tw io.Writer) {
		fmt.Fprintf(tw, "Name:\t%s\n", p.Name)
		fmt.Fprintf(tw, "Namespace:\t%s\n", p.Namespace)
		fmt.Fprintf(tw, "Node:\t%s\n", orNone(p.Spec.NodeName))
		if t := p.Status.StartTime; t != nil {
			fmt.Fprintf(tw, "Start Time:\t%s\n", t.Local().Format(timeLayout))
		}
		labels := sortedKeys(p.Labels)
		if len(labels) == 0 {
			fmt.Fprintf(tw, "Labels:\t%s\n", none)
		}
		for i, k := range labels {
			head := ""
			if i == 0 {
				head = "Labels:"
			}
			fmt.Fprintf(tw, "%s\t%s=%s\n", head, k, p.Labels[k])
		}
		fmt.Fprintf(tw, "Status:\t%s\n", orNone(string(p.Status.Phase)))
		if p.Status.Reason != "" {
			fmt.Fprintf(tw, "Reason:\t%s\n", p.Status.Reason)
		}
		if p.Status.Message != "" {
			fmt.Fprintf(tw, "Message:\t%s\n", oneLine(p.Status.Message))
		}
		if len(p.Status.Conditions) == 0 {
			fmt.Fprintf(tw, "Conditions:\t%s\n", none)
		} else {
			fmt.Fprintln(tw, "Conditions:")
			fmt.Fprintln(tw, "  Type\tStatus\tReason\tMessage")
			for _, c := range p.Status.Conditions {
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", c.Type, c.Status, c.Reason, oneLine(c.Message))
			}
		}
		if len(p.Spec.InitContainers) > 0 {
			fmt.Fprintln(tw, "Init Containers:")
			describeContainers(tw, p.Spec.InitContainers, p.Status.InitContainerStatuses, refs)
		}
		fmt.Fprintln(tw, "Containers:")
		describeContainers(tw, p.Spec.Containers, p.Status.ContainerStatuses, refs)
		if len(refs) == 0 {
			fmt.Fprintf(tw, "Resource Claims:\t%s\n", none)
		} else {
			fmt.Fprintln(tw, "Resource Claims:")
		}
		for _, r := range refs {
			describeClaim(tw, r, claims[r.Claim])
		}
		if len(events) == 0 {
			fmt.Fprintf(tw, "Events:\t%s\n", none)
			return
		}
		fmt.Fprintln(tw, "Events:")
		eventRows(tw, "  ", now, events, false)
	})
}

// describeContainers prints each container: its image, its state (from
// statuses), whether it is ready and the claims it uses (pod claim, with
// the request, and the ResourceClaim).
func describeContainers(tw io.Writer, cs []corev1.Container, statuses []corev1.ContainerStatus, refs []podinfo.ClaimRef) {
	for _, c := range cs {
		fmt.Fprintf(tw, "  %s:\n", c.Name)
		fmt.Fprintf(tw, "    Image:\t%s\n", c.Image)
		i := slices.IndexFunc(statuses, func(s corev1.ContainerStatus) bool { return s.Name == c.Name })
		if i < 0 {
			fmt.Fprintf(tw, "    State:\t%s\n", none)
		} else {
			st := statuses[i]
			switch s := st.State; {
			case s.Waiting != nil:
				fmt.Fprintln(tw, "    State:\tWaiting")
				describeReason(tw, s.Waiting.Reason, s.Waiting.Message)
			case s.Running != nil:
				fmt.Fprintln(tw, "    State:\tRunning")
				fmt.Fprintf(tw, "      Started:\t%s\n", s.Running.StartedAt.Local().Format(timeLayout))
			case s.Terminated != nil:
				fmt.Fprintln(tw, "    State:\tTerminated")
				describeReason(tw, s.Terminated.Reason, s.Terminated.Message)
				fmt.Fprintf(tw, "      Exit Code:\t%d\n", s.Terminated.ExitCode)
			default:
				fmt.Fprintf(tw, "    State:\t%s\n", none)
			}
			ready := "False"
			if st.Ready {
				ready = "True"
			}
			fmt.Fprintf(tw, "    Ready:\t%s\n", ready)
		}
		var used []string
		for _, rc := range c.Resources.Claims {
			u := rc.Name
			if rc.Request != "" {
				u += "/" + rc.Request
			}
			if j := slices.IndexFunc(refs, func(r podinfo.ClaimRef) bool { return r.Name == rc.Name }); j >= 0 && refs[j].Claim != "" {
				u += " (" + refs[j].Claim + ")"
			}
			used = append(used, u)
		}
		fmt.Fprintf(tw, "    Claims:\t%s\n", orNone(strings.Join(used, ", ")))
	}
}

func describeReason(tw io.Writer, reason, message string) {
	if reason != "" {
		fmt.Fprintf(tw, "      Reason:\t%s\n", reason)
	}
	if message != "" {
		fmt.Fprintf(tw, "      Message:\t%s\n", oneLine(message))
	}
}

// describeClaim prints one pod claim: its ResourceClaim (and template),
// whether it is allocated, its devices and whom it is reserved for; cl is
// nil for a claim the API does not have.
func describeClaim(tw io.Writer, r podinfo.ClaimRef, cl *resourcev1.ResourceClaim) {
	fmt.Fprintf(tw, "  %s:\n", r.Name)
	claim := r.Claim
	switch {
	case claim == "":
		claim = "<not made yet>"
	case cl == nil:
		claim += " (not found)"
	}
	if r.Template != "" {
		claim += " (from template " + r.Template + ")"
	}
	fmt.Fprintf(tw, "    Claim:\t%s\n", claim)
	allocated := "no"
	if cl != nil && cl.Status.Allocation != nil {
		allocated = "yes"
	}
	fmt.Fprintf(tw, "    Allocated:\t%s\n", allocated)
	if cl == nil {
		return
	}
	fmt.Fprintf(tw, "    Devices:\t%s\n", orNone(strings.Join(claimDevices(cl), ", ")))
	var reserved []string
	for _, c := range cl.Status.ReservedFor {
		reserved = append(reserved, consumerName(c))
	}
	fmt.Fprintf(tw, "    Reserved For:\t%s\n", orNone(strings.Join(reserved, ", ")))
}

// consumerName names what a claim is reserved for as kubectl names
// objects: pod/NAME, else RESOURCE[.GROUP]/NAME.
func consumerName(c resourcev1.ResourceClaimConsumerReference) string {
	if c.APIGroup == "" && c.Resource == "pods" {
		return "pod/" + c.Name
	}
	res := c.Resource
	if c.APIGroup != "" {
		res += "." + c.APIGroup
	}
	return res + "/" + c.Name
}

// getPod reads the pod ns/name from the API at host; an error names it,
// and where it is not found, how to list the pods.
func getPod(ctx context.Context, cs kubernetes.Interface, host, ns, name string) (*corev1.Pod, error) {
	pod, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("pod %s/%s not found (nodeplugctl pods lists the pods)", ns, name)
	case err != nil:
		return nil, fmt.Errorf("get pod %s/%s at %s: %w", ns, name, host, err)
	}
	return pod, nil
}
