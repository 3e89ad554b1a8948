package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodeplug/nodeplug/pkg/layout"
)

const applyArgs = "-f FILE.yaml [--kubeconfig PATH] [--namespace NS]"

// maxApplyFile bounds the file apply reads.
const maxApplyFile = 8 << 20

// strictCodecs decode the Kubernetes types, refusing unknown and
// duplicate fields.
var strictCodecs = serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict)

// decodeObjects decodes every document of a YAML (or JSON) stream into
// DeviceClasses and ResourceClaims of resource.k8s.io/v1; anything else,
// or a document that does not decode, is an error naming the document.
// Empty documents are skipped.
func decodeObjects(data []byte) ([]runtime.Object, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []runtime.Object
	for n := 1; ; n++ {
		var raw runtime.RawExtension
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("document %d: %w", n, err)
		}
		if len(bytes.TrimSpace(raw.Raw)) == 0 || string(bytes.TrimSpace(raw.Raw)) == "null" {
			continue
		}
		obj, gvk, err := strictCodecs.UniversalDeserializer().Decode(raw.Raw, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", n, err)
		}
		switch obj.(type) {
		case *resourcev1.DeviceClass, *resourcev1.ResourceClaim:
			out = append(out, obj)
		default:
			return nil, fmt.Errorf("document %d: kind %s of %s: only DeviceClass and ResourceClaim of %s can be applied",
				n, gvk.Kind, gvk.GroupVersion(), resourcev1.SchemeGroupVersion)
		}
	}
}

// applyObject creates obj, or updates it when it exists and differs; it
// returns what happened: created, configured or unchanged.
func applyObject(ctx context.Context, cs kubernetes.Interface, obj runtime.Object, namespace string) (string, string, error) {
	switch o := obj.(type) {
	case *resourcev1.DeviceClass:
		api := cs.ResourceV1().DeviceClasses()
		name := "deviceclass.resource.k8s.io/" + o.Name
		old, err := api.Get(ctx, o.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = api.Create(ctx, o, metav1.CreateOptions{})
			return name, "created", err
		}
		if err != nil {
			return name, "", err
		}
		if sameMeta(&old.ObjectMeta, &o.ObjectMeta) && covers(old.Spec, o.Spec) {
			return name, "unchanged", nil
		}
		o.ResourceVersion = old.ResourceVersion
		_, err = api.Update(ctx, o, metav1.UpdateOptions{})
		return name, "configured", err
	case *resourcev1.ResourceClaim:
		if o.Namespace == "" {
			o.Namespace = namespace
		}
		api := cs.ResourceV1().ResourceClaims(o.Namespace)
		name := "resourceclaim.resource.k8s.io/" + o.Name + " in namespace " + o.Namespace
		old, err := api.Get(ctx, o.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = api.Create(ctx, o, metav1.CreateOptions{})
			return name, "created", err
		}
		if err != nil {
			return name, "", err
		}
		if sameMeta(&old.ObjectMeta, &o.ObjectMeta) && covers(old.Spec, o.Spec) {
			return name, "unchanged", nil
		}
		o.ResourceVersion = old.ResourceVersion
		_, err = api.Update(ctx, o, metav1.UpdateOptions{})
		return name, "configured", err
	}
	return "", "", fmt.Errorf("cannot apply %T", obj)
}

// covers says whether have holds every field want sets, with the same
// value: the API fills in defaults (a request's allocation mode and
// count), so a spec as written is compared with what the API holds by the
// fields the file sets.
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

// sameMeta: the labels and annotations the file sets are already there.
func sameMeta(old, want *metav1.ObjectMeta) bool {
	for k, v := range want.Labels {
		if old.Labels[k] != v {
			return false
		}
	}
	for k, v := range want.Annotations {
		if old.Annotations[k] != v {
			return false
		}
	}
	return true
}

func cmdApply(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("apply", applyArgs)
	file := fs.String("f", "", "the YAML (or JSON) file: DeviceClass and ResourceClaim documents (required)")
	fs.StringVar(file, "filename", "", "same as -f")
	kubeconfig := fs.String("kubeconfig", "", "the API's kubeconfig (default <root-dir>/nodeplug/kubeconfig-operator, the node-local API's operator)")
	namespace := fs.String("namespace", "default", "the namespace of claims that name none")
	if err := noArgs(fs, args); err != nil {
		return err
	}
	if *file == "" {
		return usagef("-f FILE is required")
	}
	data, err := readLimited(*file)
	if err != nil {
		return err
	}
	objs, err := decodeObjects(data)
	if err != nil {
		return fmt.Errorf("%s: %w (nothing was applied)", *file, err)
	}
	if len(objs) == 0 {
		return fmt.Errorf("%s: no DeviceClass or ResourceClaim in it", *file)
	}
	if *kubeconfig == "" {
		*kubeconfig = layout.IdentityKubeconfigFile(c.g.rootDir, "operator")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w (is the devicemanager's node-local resource API set up under --root-dir %s?)", *kubeconfig, err, c.g.rootDir)
	}
	cfg.Timeout = c.g.timeout
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", *kubeconfig, err)
	}
	for _, obj := range objs {
		name, what, err := applyObject(ctx, cs, obj, *namespace)
		if err != nil {
			return fmt.Errorf("apply %s at %s: %w", name, cfg.Host, err)
		}
		if _, err := fmt.Fprintf(c.stdout, "%s %s\n", name, what); err != nil {
			return err
		}
	}
	return nil
}

func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	data, err := io.ReadAll(io.LimitReader(f, maxApplyFile+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > maxApplyFile {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxApplyFile)
	}
	return data, nil
}
