package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/nodeplug/nodeplug/pkg/layout"
)

const applyArgs = "-f FILE.yaml|- [--kubeconfig PATH] [--namespace NS]"

// maxApplyFile bounds the file (or standard input) apply and delete read.
const maxApplyFile = 8 << 20

// strictCodecs decode the Kubernetes types, refusing unknown and
// duplicate fields.
var strictCodecs = serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict)

// objectKind is a kind of the node-local API that apply and delete take.
type objectKind struct {
	gvk        schema.GroupVersionKind
	resource   string // plural, as in the URL
	singular   string
	shortNames []string
	namespaced bool
	// rank orders a file's objects: apply goes up (what others need
	// first), delete down.
	rank int
}

// objectKinds are the kinds the node-local API lets its operator write,
// in the order apply creates them.
var objectKinds = []*objectKind{
	{gvk: corev1.SchemeGroupVersion.WithKind("Namespace"), resource: "namespaces", singular: "namespace", shortNames: []string{"ns"}, rank: 0},
	{gvk: resourcev1.SchemeGroupVersion.WithKind("DeviceClass"), resource: "deviceclasses", singular: "deviceclass", rank: 1},
	{gvk: resourcev1.SchemeGroupVersion.WithKind("DeviceTaintRule"), resource: "devicetaintrules", singular: "devicetaintrule", rank: 1},
	{gvk: resourcev1.SchemeGroupVersion.WithKind("ResourceClaimTemplate"), resource: "resourceclaimtemplates", singular: "resourceclaimtemplate", namespaced: true, rank: 2},
	{gvk: resourcev1.SchemeGroupVersion.WithKind("ResourceClaim"), resource: "resourceclaims", singular: "resourceclaim", namespaced: true, rank: 2},
	{gvk: corev1.SchemeGroupVersion.WithKind("Pod"), resource: "pods", singular: "pod", shortNames: []string{"po"}, namespaced: true, rank: 3},
	{gvk: corev1.SchemeGroupVersion.WithKind("Event"), resource: "events", singular: "event", shortNames: []string{"ev"}, namespaced: true, rank: 4},
}

func (k *objectKind) gvr() schema.GroupVersionResource {
	return k.gvk.GroupVersion().WithResource(k.resource)
}

// qualified is the kind as kubectl prints it before an object's name: the
// singular resource, with its group unless it is the core group.
func (k *objectKind) qualified() string {
	if k.gvk.Group == "" {
		return k.singular
	}
	return k.singular + "." + k.gvk.Group
}

// kindOf returns the kind of objectKinds gvk is, or nil.
func kindOf(gvk schema.GroupVersionKind) *objectKind {
	for _, k := range objectKinds {
		if k.gvk == gvk {
			return k
		}
	}
	return nil
}

// takenKinds lists the kinds apply and delete take, by API version, for
// the messages that refuse another one.
func takenKinds() string {
	var parts []string
	var gv schema.GroupVersion
	var names []string
	flush := func() {
		if len(names) > 0 {
			parts = append(parts, strings.Join(names, ", ")+" of "+gv.String())
		}
	}
	sorted := slices.Clone(objectKinds)
	slices.SortStableFunc(sorted, func(a, b *objectKind) int { return strings.Compare(a.gvk.Group, b.gvk.Group) })
	for _, k := range sorted {
		if k.gvk.GroupVersion() != gv {
			flush()
			gv, names = k.gvk.GroupVersion(), nil
		}
		names = append(names, k.gvk.Kind)
	}
	flush()
	return strings.Join(parts, "; ")
}

// object is one document of a file, checked.
type object struct {
	doc  int // its document number in the file, from 1
	kind *objectKind
	// obj is what is sent: the document as its typed object reads it,
	// without a status (the API's status is not apply's to write).
	obj *unstructured.Unstructured
	// set holds the fields the document sets (as the typed object writes
	// them), without status and the metadata the server owns: an object
	// the API holds is unchanged when it has them all.
	set map[string]any
}

// name is the object as kubectl prints it: pod/demo,
// deviceclass.resource.k8s.io/gpu.
func (o *object) name() string { return o.kind.qualified() + "/" + o.obj.GetName() }

// decodeObjects decodes every document of a YAML (or JSON) stream into
// objects of the kinds apply and delete take. A document of another kind
// or version, one that does not decode strictly, or one without a name is
// an error naming the document; verb ("applied", "deleted") says what the
// refused kind cannot be. Empty documents are skipped.
func decodeObjects(data []byte, verb string) ([]*object, error) {
	next := documents(data)
	var out []*object
	for n := 1; ; n++ {
		doc, err := next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("document %d: %w", n, err)
		}
		doc = bytes.TrimSpace(doc)
		if len(doc) == 0 || string(doc) == "null" {
			continue
		}
		// The kind first: one the API does not take is refused by name,
		// whether or not client-go knows it.
		var tm metav1.TypeMeta
		if json.Unmarshal(doc, &tm) == nil && tm.APIVersion != "" && tm.Kind != "" {
			gvk := schema.FromAPIVersionAndKind(tm.APIVersion, tm.Kind)
			if kindOf(gvk) == nil {
				return nil, refusedKind(n, gvk, verb)
			}
		}
		typed, gvk, err := strictCodecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", n, err)
		}
		k := kindOf(*gvk)
		if k == nil {
			return nil, refusedKind(n, *gvk, verb)
		}
		o, err := newObject(n, k, doc, typed)
		if err != nil {
			return nil, fmt.Errorf("document %d: %s: %w", n, k.gvk.Kind, err)
		}
		out = append(out, o)
	}
}

// documents returns a function that returns data's documents one by one,
// as JSON, then io.EOF: a JSON stream (data begins with '{') object by
// object, else the YAML documents, each read strictly (a key twice in a
// mapping is an error, as the strict decoding of JSON has it).
func documents(data []byte) func() ([]byte, error) {
	if utilyaml.IsJSONBuffer(data) {
		dec := json.NewDecoder(bytes.NewReader(data))
		return func() ([]byte, error) {
			var raw json.RawMessage
			err := dec.Decode(&raw)
			return raw, err
		}
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	return func() ([]byte, error) {
		doc, err := r.Read()
		if err != nil {
			return nil, err
		}
		return sigsyaml.YAMLToJSONStrict(doc)
	}
}

func refusedKind(n int, gvk schema.GroupVersionKind, verb string) error {
	hint := ""
	for _, k := range objectKinds {
		if k.gvk.GroupKind() == gvk.GroupKind() {
			hint = fmt.Sprintf(" (the node-local API serves %s at %s only)", k.gvk.Kind, k.gvk.GroupVersion())
		}
	}
	return fmt.Errorf("document %d: kind %s of %s cannot be %s%s: only %s can be", n, gvk.Kind, gvk.GroupVersion(), verb, hint, takenKinds())
}

// serverMeta are the metadata fields the server owns: a file's are not
// compared with the stored ones.
var serverMeta = []string{"uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp",
	"deletionGracePeriodSeconds", "managedFields", "selfLink"}

func newObject(n int, k *objectKind, doc []byte, typed runtime.Object) (*object, error) {
	content, err := runtime.DefaultUnstructuredConverter.ToUnstructured(typed)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: content}
	u.SetGroupVersionKind(k.gvk)
	if u.GetName() == "" {
		if u.GetGenerateName() != "" {
			return nil, errors.New("metadata.generateName is not supported: name the object (metadata.name)")
		}
		return nil, errors.New("metadata.name is required")
	}
	unstructured.RemoveNestedField(u.Object, "status")
	if !k.namespaced {
		u.SetNamespace("")
	}
	// The fields the document sets, with the values the typed object
	// writes (a quantity as the API writes it back, say).
	var asWritten, asTyped any
	tb, err := json.Marshal(typed)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(doc, &asWritten); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(tb, &asTyped); err != nil {
		return nil, err
	}
	set, _ := fieldsSet(asTyped, asWritten).(map[string]any)
	if set == nil {
		set = map[string]any{}
	}
	delete(set, "status")
	if md, ok := set["metadata"].(map[string]any); ok {
		for _, f := range serverMeta {
			delete(md, f)
		}
		if !k.namespaced {
			delete(md, "namespace")
		}
	}
	return &object{doc: n, kind: k, obj: u, set: set}, nil
}

// fieldsSet returns the parts of typed that written (the same document as
// read without its type) sets: maps keep only written's keys, lists are
// taken element by element; a null is a field not set.
func fieldsSet(typed, written any) any {
	switch w := written.(type) {
	case nil:
		return nil
	case map[string]any:
		t, ok := typed.(map[string]any)
		if !ok {
			return typed
		}
		out := map[string]any{}
		for key, wv := range w {
			tv, ok := t[key]
			if !ok {
				continue
			}
			if v := fieldsSet(tv, wv); v != nil {
				out[key] = v
			}
		}
		return out
	case []any:
		t, ok := typed.([]any)
		if !ok || len(t) != len(w) {
			return typed
		}
		out := make([]any, len(t))
		for i := range t {
			out[i] = fieldsSet(t[i], w[i])
		}
		return out
	default:
		return typed
	}
}

// covers says whether have holds every field want sets, with the same
// value: the API fills in defaults (a request's allocation mode and
// count), so an object as written is compared with what the API holds by
// the fields the file sets.
func covers(have, want any) bool {
	var h, w any
	hb, err1 := json.Marshal(have)
	wb, err2 := json.Marshal(want)
	if err1 != nil || err2 != nil || json.Unmarshal(hb, &h) != nil || json.Unmarshal(wb, &w) != nil {
		return false
	}
	return subset(h, w)
}

func subset(have, want any) bool {
	switch w := want.(type) {
	case map[string]any:
		h, ok := have.(map[string]any)
		if !ok {
			return false
		}
		for k, wv := range w {
			hv, ok := h[k]
			if !ok || !subset(hv, wv) {
				return false
			}
		}
		return true
	case []any:
		h, ok := have.([]any)
		if !ok || len(h) != len(w) {
			return false
		}
		for i := range w {
			if !subset(h[i], w[i]) {
				return false
			}
		}
		return true
	default:
		return have == want
	}
}

// inNamespace gives the namespaced objects that name no namespace ns (an
// object's own namespace wins).
func inNamespace(objs []*object, ns string) {
	for _, o := range objs {
		if o.kind.namespaced && o.obj.GetNamespace() == "" {
			o.obj.SetNamespace(ns)
		}
	}
}

// byRank orders objs for apply (up) or delete (down), keeping the file's
// order among objects of one rank.
func byRank(objs []*object, down bool) []*object {
	out := slices.Clone(objs)
	slices.SortStableFunc(out, func(a, b *object) int {
		if down {
			return b.kind.rank - a.kind.rank
		}
		return a.kind.rank - b.kind.rank
	})
	return out
}

// resourceFor is the dynamic client's interface to the resource of k (in
// namespace, when k is namespaced).
func resourceFor(dc dynamic.Interface, k *objectKind, namespace string) dynamic.ResourceInterface {
	if k.namespaced {
		return dc.Resource(k.gvr()).Namespace(namespace)
	}
	return dc.Resource(k.gvr())
}

// applyObject creates o, or updates it when it exists and differs; it
// returns what happened: created, configured or unchanged.
func applyObject(ctx context.Context, dc dynamic.Interface, o *object) (string, error) {
	api := resourceFor(dc, o.kind, o.obj.GetNamespace())
	obj := o.obj.DeepCopy()
	old, err := api.Get(ctx, obj.GetName(), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		obj.SetResourceVersion("")
		_, err = api.Create(ctx, obj, metav1.CreateOptions{})
		return "created", err
	}
	if err != nil {
		return "", err
	}
	if covers(old.Object, o.set) {
		return "unchanged", nil
	}
	obj.SetResourceVersion(old.GetResourceVersion())
	_, err = api.Update(ctx, obj, metav1.UpdateOptions{})
	return "configured", err
}

// operatorClient is a dynamic client of the node-local API with the
// kubeconfig given, else the operator's under the root dir; and the API's
// address.
func (c *cli) operatorClient(kubeconfig string) (dynamic.Interface, string, error) {
	cfg, kubeconfig, err := c.apiConfig(kubeconfig)
	if err != nil {
		return nil, "", err
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	return dc, cfg.Host, nil
}

// apiConfig reads the kubeconfig given, else the operator's under the root
// dir, with --timeout on each request; it returns the kubeconfig read.
func (c *cli) apiConfig(kubeconfig string) (*rest.Config, string, error) {
	if kubeconfig == "" {
		kubeconfig = layout.IdentityKubeconfigFile(c.g.rootDir, "operator")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, kubeconfig, fmt.Errorf("kubeconfig %s: %w (is the devicemanager's node-local resource API set up under --root-dir %s?)", kubeconfig, err, c.g.rootDir)
	}
	cfg.Timeout = c.g.timeout
	return cfg, kubeconfig, nil
}

const kubeconfigUsage = "the API's kubeconfig (default <root-dir>/nodeplug/kubeconfig-operator, the node-local API's operator)"

// readObjects reads and decodes the file of -f (standard input for "-"),
// the whole file before anything is sent; verb is what the error says was
// not done.
func (c *cli) readObjects(file, verb string) ([]*object, error) {
	data, err := c.readLimited(file)
	if err != nil {
		return nil, err
	}
	objs, err := decodeObjects(data, verb)
	if err != nil {
		return nil, fmt.Errorf("%s: %w (nothing was %s)", inputName(file), err, verb)
	}
	if len(objs) == 0 {
		return nil, fmt.Errorf("%s: no object in it (nothing was %s)", inputName(file), verb)
	}
	return objs, nil
}

func cmdApply(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("apply", applyArgs)
	file := fs.String("f", "", "the YAML (or JSON) file, - for standard input: "+takenKinds()+" (required)")
	fs.StringVar(file, "filename", "", "same as -f")
	kubeconfig := fs.String("kubeconfig", "", kubeconfigUsage)
	namespace := fs.String("namespace", "default", "the namespace of the namespaced objects that name none")
	fs.StringVar(namespace, "n", "default", "same as --namespace")
	if err := noArgs(fs, args); err != nil {
		return err
	}
	if *file == "" {
		return usagef("-f FILE is required")
	}
	objs, err := c.readObjects(*file, "applied")
	if err != nil {
		return err
	}
	inNamespace(objs, *namespace)
	dc, host, err := c.operatorClient(*kubeconfig)
	if err != nil {
		return err
	}
	for _, o := range byRank(objs, false) {
		what, err := applyObject(ctx, dc, o)
		if err != nil {
			return fmt.Errorf("apply %s%s (document %d) at %s: %w", o.name(), inNS(o.kind, o.obj.GetNamespace()), o.doc, host, err)
		}
		if _, err := fmt.Fprintf(c.stdout, "%s %s\n", o.name(), what); err != nil {
			return err
		}
	}
	return nil
}

// inNS says which namespace an object of k is in, for messages.
func inNS(k *objectKind, namespace string) string {
	if !k.namespaced {
		return ""
	}
	return " in namespace " + namespace
}

// inputName names the file of -f in messages.
func inputName(path string) string {
	if path == "-" {
		return "standard input"
	}
	return path
}

// readLimited reads path, or standard input for "-", up to maxApplyFile
// bytes.
func (c *cli) readLimited(path string) ([]byte, error) {
	var r io.Reader
	if path == "-" {
		if c.stdin == nil {
			return nil, errors.New("no standard input to read")
		}
		r = c.stdin
	} else {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer func() { _ = f.Close() }()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, maxApplyFile+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", inputName(path), err)
	}
	if len(data) > maxApplyFile {
		return nil, fmt.Errorf("%s is larger than %d bytes", inputName(path), maxApplyFile)
	}
	return data, nil
}
