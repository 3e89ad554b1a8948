package kubeaccess

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/nodeplug/nodeplug/pkg/refdoc"
)

// repoFile is the file at rel, a slash path below the module's root.
func repoFile(t *testing.T, rel string) string {
	t.Helper()
	root, err := refdoc.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, filepath.FromSlash(rel))
}

// manifest is an RBAC manifest's ClusterRole and ClusterRoleBinding.
type manifest struct {
	role    rbacv1.ClusterRole
	binding rbacv1.ClusterRoleBinding
}

// readManifest parses the YAML documents of the file at rel into a
// ClusterRole and a ClusterRoleBinding (strictly: an unknown field is an
// error), and checks that the binding binds that role.
func readManifest(t *testing.T, rel string) manifest {
	t.Helper()
	b, err := os.ReadFile(repoFile(t, rel))
	if err != nil {
		t.Fatal(err)
	}
	var m manifest
	var kinds []string
	for i, doc := range bytes.Split(b, []byte("\n---\n")) {
		var meta struct{ APIVersion, Kind string }
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatalf("%s, document %d: %v", rel, i, err)
		}
		if meta.APIVersion != rbacv1.SchemeGroupVersion.String() {
			t.Fatalf("%s, document %d: apiVersion %q, want %s", rel, i, meta.APIVersion, rbacv1.SchemeGroupVersion)
		}
		kinds = append(kinds, meta.Kind)
		var into any
		switch meta.Kind {
		case "ClusterRole":
			into = &m.role
		case "ClusterRoleBinding":
			into = &m.binding
		default:
			t.Fatalf("%s, document %d: kind %q, want a ClusterRole or a ClusterRoleBinding", rel, i, meta.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, into); err != nil {
			t.Fatalf("%s, document %d (%s): %v", rel, i, meta.Kind, err)
		}
	}
	if !slices.Equal(kinds, []string{"ClusterRole", "ClusterRoleBinding"}) {
		t.Fatalf("%s holds %v, want a ClusterRole, then its ClusterRoleBinding", rel, kinds)
	}
	if r := m.binding.RoleRef; r.APIGroup != rbacv1.GroupName || r.Kind != "ClusterRole" || r.Name != m.role.Name || m.role.Name == "" {
		t.Errorf("%s: the binding refers to %+v, not to the ClusterRole %q", rel, r, m.role.Name)
	}
	if len(m.binding.Subjects) != 1 {
		t.Errorf("%s: the binding has %d subjects, want 1", rel, len(m.binding.Subjects))
	}
	return m
}

// grants expands RBAC rules into the permissions they grant, each one
// verb on one group's resource[/subresource], as Rule.String names it.
// A wildcard stays a "*" (and so matches no rule), as do resource names
// and URLs (which the table never needs).
func grants(t *testing.T, rules []rbacv1.PolicyRule) []string {
	t.Helper()
	var out []string
	for _, p := range rules {
		if len(p.ResourceNames) > 0 || len(p.NonResourceURLs) > 0 {
			t.Errorf("rule %+v names objects or URLs: the dramanager needs neither", p)
		}
		for _, g := range p.APIGroups {
			for _, res := range p.Resources {
				for _, v := range p.Verbs {
					r := Rule{Verb: v, Group: g, Resource: res}
					out = append(out, r.String())
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

func required() []string {
	var out []string
	for _, r := range Required {
		out = append(out, r.String())
	}
	slices.Sort(out)
	return out
}

// TestManifestGrantsRequired: deploy/rbac/nodeplug.yaml's ClusterRole
// grants every rule of Required and nothing else (least privilege, both
// ways), to the group its comments name.
func TestManifestGrantsRequired(t *testing.T) {
	m := readManifest(t, Manifest)
	if m.role.Name != "nodeplug-dramanager" {
		t.Errorf("the ClusterRole is %q, want nodeplug-dramanager", m.role.Name)
	}
	if m.role.AggregationRule != nil {
		t.Error("the ClusterRole aggregates others: it would grant what they grant")
	}
	got, want := grants(t, m.role.Rules), required()
	for _, g := range got {
		if !slices.Contains(want, g) {
			t.Errorf("%s grants %s, which kubeaccess.Required does not list: remove it, or add it to the table with the code that needs it", Manifest, g)
		}
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("%s does not grant %s, which kubeaccess.Required lists", Manifest, w)
		}
	}
	if dup := slices.Compact(slices.Clone(got)); len(dup) != len(got) {
		t.Errorf("%s grants some permissions twice: %v", Manifest, got)
	}
	want1 := rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "nodeplug:dramanagers"}
	if s := m.binding.Subjects; len(s) != 1 || s[0] != want1 {
		t.Errorf("the binding's subjects are %+v, want %+v", s, want1)
	}
}

// TestRequiredIsWellFormed: each rule once, with what calls it and what
// fails without it.
func TestRequiredIsWellFormed(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range Required {
		if seen[r.String()] {
			t.Errorf("%s is listed twice", r)
		}
		seen[r.String()] = true
		if r.Verb == "" || r.Resource == "" || r.Why == "" || r.Without == "" {
			t.Errorf("%+v: verb, resource, why and without are required", r)
		}
	}
}

// TestExampleDriverManifest: deploy/rbac/example-dra-driver.yaml parses
// into a ClusterRole bound to the user its comment says to change, and
// grants what the kubeletplugin helper calls.
func TestExampleDriverManifest(t *testing.T) {
	m := readManifest(t, "deploy/rbac/example-dra-driver.yaml")
	want := rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "example-dra-driver"}
	if s := m.binding.Subjects; len(s) != 1 || s[0] != want {
		t.Errorf("the binding's subjects are %+v, want %+v", s, want)
	}
	got := grants(t, m.role.Rules)
	for _, w := range []Rule{
		{Verb: "list", Group: resourceGroup, Resource: "resourceslices"},
		{Verb: "watch", Group: resourceGroup, Resource: "resourceslices"},
		{Verb: "create", Group: resourceGroup, Resource: "resourceslices"},
		{Verb: "update", Group: resourceGroup, Resource: "resourceslices"},
		{Verb: "delete", Group: resourceGroup, Resource: "resourceslices"},
		{Verb: "get", Resource: "nodes"},
		{Verb: "get", Group: resourceGroup, Resource: "resourceclaims"},
	} {
		if !slices.Contains(got, w.String()) {
			t.Errorf("the example driver's role does not grant %s", w)
		}
	}
}

// The table of Required in docs/dra-drivers.md, between these markers.
const (
	docsFile   = "docs/dra-drivers.md"
	docsBegin  = "<!-- rbac:begin: generated from kubeaccess.Required (services/dramanager/internal/kubeaccess/rules.go); do not edit -->\n"
	docsEnd    = "<!-- rbac:end -->\n"
	docsUpdate = "NODEPLUG_UPDATE_DOCS=1 go test -run '^TestReference$' ./services/dramanager/internal/kubeaccess/"
)

// rulesMarkdown renders Required as the docs show it.
func rulesMarkdown() string {
	var rows [][]string
	for _, r := range Required {
		group := refdoc.CodeCell(r.Group)
		if r.Group == "" {
			group = "core (`\"\"`)"
		}
		rows = append(rows, []string{refdoc.CodeCell(r.Verb), group, refdoc.CodeCell(r.Path()), refdoc.Cell(r.Why), refdoc.Cell(r.Without)})
	}
	return refdoc.Table([]string{"verb", "API group", "resource", "needed by", "without it"}, rows)
}

// TestReference: docs/dra-drivers.md lists the rules of Required, as
// rulesMarkdown renders them, between its rbac markers; with
// NODEPLUG_UPDATE_DOCS=1 (make docs) the test writes them there.
func TestReference(t *testing.T) {
	path := repoFile(t, docsFile)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	before, rest, ok := strings.Cut(doc, docsBegin)
	committed, after, ok2 := strings.Cut(rest, docsEnd)
	if !ok || !ok2 {
		t.Fatalf("%s has no %q … %q markers around the permissions' table", docsFile, strings.TrimSpace(docsBegin), strings.TrimSpace(docsEnd))
	}
	generated := rulesMarkdown()
	if os.Getenv(refdoc.UpdateEnv) == "1" {
		if err := os.WriteFile(path, []byte(before+docsBegin+generated+docsEnd+after), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if line, c, g, differ := refdoc.FirstDifference([]byte(committed), []byte(generated)); differ {
		t.Fatalf("the permissions' table in %s is stale: run `%s` and commit it\nfirst difference at its line %d:\n  committed: %s\n  generated: %s",
			docsFile, docsUpdate, line, c, g)
	}
}
