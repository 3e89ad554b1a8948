package main

import (
	"context"
	"flag"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const deleteArgs = "-f FILE.yaml|- | KIND [NS/]NAME... | KIND/NAME... [--namespace NS] [--ignore-not-found] [--kubeconfig PATH]"

// target is one object delete names: by a file's document or on the
// command line.
type target struct {
	kind      *objectKind
	namespace string
	name      string
}

func (t target) String() string { return t.kind.qualified() + "/" + t.name }

// kindNamed returns the kind a command line names: its resource (plural),
// singular or short name, or its kind, each also with the group after a
// dot (deviceclass.resource.k8s.io), in any case.
func kindNamed(s string) *objectKind {
	s = strings.ToLower(s)
	for _, k := range objectKinds {
		names := append([]string{k.resource, k.singular, strings.ToLower(k.gvk.Kind)}, k.shortNames...)
		for _, n := range names {
			if s == n || (k.gvk.Group != "" && s == n+"."+k.gvk.Group) {
				return k
			}
		}
	}
	return nil
}

// kindNames lists the names kindNamed takes, for messages.
func kindNames() string {
	var out []string
	for _, k := range objectKinds {
		n := k.singular + " (" + k.resource
		for _, s := range k.shortNames {
			n += ", " + s
		}
		out = append(out, n+")")
	}
	return strings.Join(out, ", ")
}

// parseTargets reads the objects the command line names: KIND NAME...
// (each NAME may be NS/NAME) or KIND/NAME...; namespace is --namespace,
// explicit when given on the command line.
func parseTargets(pos []string, namespace string, explicit bool) ([]target, error) {
	unknown := func(s string) error {
		return usagef("unknown kind %q: delete takes %s", s, kindNames())
	}
	var out []target
	add := func(k *objectKind, name string) error {
		ns, n, hasNS := strings.Cut(name, "/")
		if !hasNS {
			ns, n = namespace, name
		}
		switch {
		case n == "" || strings.Contains(n, "/") || (hasNS && ns == ""):
			return usagef("%q: want NAME or NAMESPACE/NAME", name)
		case hasNS && !k.namespaced:
			return usagef("%s/%s: a %s is not in a namespace: name it alone", k.singular, name, k.singular)
		case hasNS && explicit && ns != namespace:
			return usagef("%s/%s is in namespace %s, not --namespace %s", k.singular, n, ns, namespace)
		}
		if !k.namespaced {
			ns = ""
		}
		out = append(out, target{kind: k, namespace: ns, name: n})
		return nil
	}
	if len(pos) == 0 {
		return nil, usagef("name the objects: -f FILE, KIND NAME or KIND/NAME")
	}
	if strings.Contains(pos[0], "/") { // KIND/NAME...
		for _, p := range pos {
			kn, name, _ := strings.Cut(p, "/")
			k := kindNamed(kn)
			if k == nil {
				return nil, unknown(kn)
			}
			if name == "" || strings.Contains(name, "/") {
				return nil, usagef("%q: want KIND/NAME (with --namespace for the namespace)", p)
			}
			if err := add(k, name); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	k := kindNamed(pos[0])
	if k == nil {
		return nil, unknown(pos[0])
	}
	if len(pos) == 1 {
		return nil, usagef("name the %s to delete: %s NAME", k.singular, pos[0])
	}
	for _, name := range pos[1:] {
		if err := add(k, name); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func cmdDelete(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("delete", deleteArgs)
	file := fs.String("f", "", "the YAML (or JSON) file whose objects to delete, - for standard input: "+takenKinds())
	fs.StringVar(file, "filename", "", "same as -f")
	kubeconfig := fs.String("kubeconfig", "", kubeconfigUsage)
	namespace := fs.String("namespace", "default", "the namespace of the namespaced objects that name none")
	fs.StringVar(namespace, "n", "default", "same as --namespace")
	ignoreNotFound := fs.Bool("ignore-not-found", false, "an object that is not there is no error (and is not reported)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	explicit := false
	fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "namespace" || f.Name == "n" })
	var targets []target
	if *file != "" {
		if len(pos) > 0 {
			return usagef("-f FILE names the objects: unexpected arguments %q", pos)
		}
		objs, err := c.readObjects(*file, "deleted")
		if err != nil {
			return err
		}
		inNamespace(objs, *namespace)
		for _, o := range byRank(objs, true) {
			targets = append(targets, target{kind: o.kind, namespace: o.obj.GetNamespace(), name: o.obj.GetName()})
		}
	} else if targets, err = parseTargets(pos, *namespace, explicit); err != nil {
		return err
	}
	dc, host, err := c.operatorClient(*kubeconfig)
	if err != nil {
		return err
	}
	missing := 0
	for _, t := range targets {
		err := resourceFor(dc, t.kind, t.namespace).Delete(ctx, t.name, metav1.DeleteOptions{})
		switch {
		case apierrors.IsNotFound(err):
			if !*ignoreNotFound {
				missing++
				fmt.Fprintf(c.stderr, "Error from server (NotFound): %v\n", err)
			}
			continue
		case err != nil:
			return fmt.Errorf("delete %s%s at %s: %w", t, inNS(t.kind, t.namespace), host, err)
		}
		if _, err := fmt.Fprintf(c.stdout, "%s deleted\n", t); err != nil {
			return err
		}
	}
	switch {
	case missing == 1:
		return fmt.Errorf("1 object was not found (--ignore-not-found: no error)")
	case missing > 1:
		return fmt.Errorf("%d objects were not found (--ignore-not-found: no error)", missing)
	}
	return nil
}
