package app

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodeplug/nodeplug/pkg/refdoc"
)

// referenceServices are the services configuration.md links to, in its
// order; each one's TestReference writes docs/reference/config/<name>.md.
var referenceServices = []string{"watcher", "reconciler", "devicemanager", "dramanager", "apiserver"}

// TestReference: docs/reference/configuration.md is what the common flag
// set renders (make docs writes it), and docs/reference/config/ holds a
// page for each service it links to and no other.
func TestReference(t *testing.T) {
	err := refdoc.CheckStable("docs/reference/configuration.md", t, func() (string, error) {
		return ConfigurationReference(referenceServices)
	})
	if err != nil {
		t.Fatal(err)
	}
	root, err := refdoc.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	pages, err := filepath.Glob(filepath.Join(root, "docs", "reference", "config", "*"))
	if err != nil {
		t.Fatal(err)
	}
	var want, got []string
	for _, s := range referenceServices {
		want = append(want, s+".md")
	}
	for _, p := range pages {
		got = append(got, filepath.Base(p))
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("docs/reference/config/ holds %v; configuration.md links to %v: remove the pages of services that are gone, "+
			"add a new service to referenceServices, then run `make docs`", got, want)
	}
}

// TestFlagRefs: each kind of flag is shown with its type, default,
// variable and usage; a removed one with what setting it answers.
func TestFlagRefs(t *testing.T) {
	fs := NewFlags("demo")
	var s string
	var b bool
	var d time.Duration
	fs.StringVar(&s, "name", "x", "a `NAME` to use")
	fs.BoolVar(&b, "on", false, "switch")
	fs.DurationVar(&d, "wait", time.Second, "how long")
	AbsPathVar(fs.FlagSet, &s, "root-dir", "/r", "root")
	fs.StringList("dir", "a dir (repeatable)")
	fs.Var(GoneFlag(errors.New("--old is gone: use --name")), "old", "removed")
	fs.Var(new(sizeValue), "size", "a size")
	got := fs.Refs()
	want := []FlagRef{
		{Name: "dir", Type: "string, repeatable", Env: "NODEPLUG_DEMO_DIR", EnvList: true, Usage: "a dir (repeatable)"},
		{Name: "name", Type: "NAME", Default: "x", Env: "NODEPLUG_DEMO_NAME", Usage: "a NAME to use"},
		{Name: "old", Type: "removed", Env: "NODEPLUG_DEMO_OLD", Usage: "removed", Removed: errors.New("--old is gone: use --name")},
		{Name: "on", Type: "bool", Default: "false", Env: "NODEPLUG_DEMO_ON", Usage: "switch"},
		{Name: "root-dir", Type: "path", Default: "/r", Env: "NODEPLUG_ROOT_DIR", Usage: "root"},
		{Name: "size", Type: "sizevalue", Default: "0", Env: "NODEPLUG_DEMO_SIZE", Usage: "a size"},
		{Name: "wait", Type: "duration", Default: "1s", Env: "NODEPLUG_DEMO_WAIT", Usage: "how long"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Refs:\n got %+v\nwant %+v", got, want)
	}
	table := FlagTable(got)
	for _, row := range []string{
		"| `--dir` | string, repeatable | *none* | `NODEPLUG_DEMO_DIR` (values separated by `:`) | a dir (repeatable) |\n",
		"| `--wait` | duration | `1s` | `NODEPLUG_DEMO_WAIT` | how long |\n",
	} {
		if !strings.Contains(table, row) {
			t.Errorf("FlagTable has no row %q:\n%s", row, table)
		}
	}
	if strings.Contains(table, "--old") {
		t.Errorf("FlagTable lists the removed --old:\n%s", table)
	}
	if removed := RemovedTable(got); !strings.Contains(removed, "| `--old` | `NODEPLUG_DEMO_OLD` | --old is gone: use --name |") {
		t.Errorf("RemovedTable:\n%s", removed)
	}
	if FlagTable(nil) != "" || RemovedTable(got[:2]) != "" {
		t.Error("a table of no flags is not empty")
	}
}

type sizeValue int64

func (v *sizeValue) String() string   { return "0" }
func (v *sizeValue) Set(string) error { return nil }

// TestFlagTableEscapes: usage text is shown as written, not as Markdown.
func TestFlagTableEscapes(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.String("o", "a|b", "table|json, <root-dir>/x, *all*")
	table := FlagTable(FlagRefs(fs))
	want := "| `-o` | string | `a\\|b` | table\\|json, \\<root-dir>/x, \\*all\\* |\n"
	if !strings.Contains(table, want) {
		t.Errorf("FlagTable:\n%s\nwant the row %q", table, want)
	}
}

// TestServiceReference: a service's page has its own flags, the common
// flags whose default is its own, its removed flags and its GOGC; the
// common flags are left to configuration.md.
func TestServiceReference(t *testing.T) {
	svc := Service{Binary: "demo", DefaultMetrics: "127.0.0.1:9999", GCPercent: 50, Flags: func(fs *Flags) {
		fs.Int("batch", 8, "items per batch")
		fs.Var(GoneFlag(errors.New("--legacy is gone")), "legacy", "removed")
	}}
	doc, err := ServiceReference(svc, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"# nodeplug-demo\n",
		"| `--batch` | int | `8` | `NODEPLUG_DEMO_BATCH` | items per batch |\n",
		"| `--metrics-listen` | string | `127.0.0.1:9999` | `NODEPLUG_DEMO_METRICS_LISTEN` |",
		"| `--api-socket` | string | *none* | `NODEPLUG_DEMO_API_SOCKET` | the API's Unix socket (default \\<root-dir>/nodeplug/demo.sock) |\n",
		"| `--legacy` | `NODEPLUG_DEMO_LEGACY` | --legacy is gone |\n",
		"`GOGC=50`",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("the page has no %q:\n%s", want, doc)
		}
	}
	for _, common := range []string{"`--log-level`", "`--watch-streams`", "`--listen`"} {
		if strings.Contains(doc, common) {
			t.Errorf("the page lists the common %s, whose default is every service's:\n%s", common, doc)
		}
	}
	if _, err := ServiceReference(svc, map[string]string{"nope": "x"}); err == nil {
		t.Error("a note for a flag the service does not have is accepted")
	}
}

// TestConfigurationReference: the common flags appear once, with their
// variables for any service and the per-service defaults marked.
func TestConfigurationReference(t *testing.T) {
	doc, err := ConfigurationReference([]string{"watcher"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| `nodeplug-watcher` | [config/watcher.md](config/watcher.md) |\n",
		"| `--log-level` | string | `info` | `NODEPLUG_<SERVICE>_LOG_LEVEL` |",
		"| `--metrics-listen` | string | each service's own |",
		"| `--root-dir` | path | `/var/lib/kubelet` | `NODEPLUG_ROOT_DIR` |",
		"| `--listen` | `NODEPLUG_<SERVICE>_LISTEN` | --listen is gone",
		"`NODEPLUG_WATCHER_LOG_LEVEL`",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("configuration.md has no %q:\n%s", want, doc)
		}
	}
}

// TestHostDefaults: a default with the home directory or the host name
// in it is refused unless a note describes it.
func TestHostDefaults(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = ""
	}
	refs := []FlagRef{{Name: "cache", Default: filepath.Join(home, ".cache")}, {Name: "addr", Default: "127.0.0.1:1"}}
	if host != "" {
		refs = append(refs, FlagRef{Name: "node", Default: host})
	}
	err = HostDefaults(refs)
	if err == nil || !strings.Contains(err.Error(), "--cache") || strings.Contains(err.Error(), "--addr") {
		t.Errorf("HostDefaults = %v, want --cache named and --addr not", err)
	}
	if host != "" && !strings.Contains(err.Error(), "--node") {
		t.Errorf("HostDefaults = %v, want --node (the host name) named", err)
	}
	for i := range refs {
		refs[i].DefaultNote = "described"
	}
	if err := HostDefaults(refs); err != nil {
		t.Errorf("with notes: %v", err)
	}
	svc := Service{Binary: "demo", Flags: func(fs *Flags) { fs.String("cache", filepath.Join(home, ".cache"), "cache") }}
	if _, err := ServiceReference(svc, nil); err == nil {
		t.Error("ServiceReference renders a default beneath HOME")
	}
	if doc, err := ServiceReference(svc, map[string]string{"cache": "$HOME/.cache"}); err != nil || !strings.Contains(doc, "| $HOME/.cache |") {
		t.Errorf("ServiceReference with a note: %v\n%s", err, doc)
	}
}

// TestEnvRulesHold: what configuration.md says of flags and variables is
// what Parse does.
func TestEnvRulesHold(t *testing.T) {
	newFlags := func() (*Flags, *string, *int, *[]string) {
		fs := NewFlags("watcher")
		fs.SetOutput(nopWriter{})
		return fs, fs.String("metrics-listen", "127.0.0.1:1", ""), fs.Int("watch-streams", 5, ""), fs.StringList("allowed-endpoint-dir", "")
	}
	t.Setenv("NODEPLUG_WATCHER_METRICS_LISTEN", "")
	t.Setenv("NODEPLUG_WATCHER_ALLOWED_ENDPOINT_DIR", "/a::/b")
	fs, metrics, _, dirs := newFlags()
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if *metrics != "" || !slices.Equal(*dirs, []string{"/a", "/b"}) {
		t.Errorf("an empty variable must set the empty string, a list split on ':' without empties: %q %q", *metrics, *dirs)
	}
	fs, metrics, _, dirs = newFlags()
	if err := fs.Parse([]string{"--metrics-listen", "127.0.0.1:1", "--allowed-endpoint-dir", "/c"}); err != nil {
		t.Fatal(err)
	}
	if *metrics != "127.0.0.1:1" || !slices.Equal(*dirs, []string{"/c"}) {
		t.Errorf("the command line must win over the variables: %q %q", *metrics, *dirs)
	}
	t.Setenv("NODEPLUG_WATCHER_WATCH_STREAMS", "")
	fs, _, _, _ = newFlags()
	if err := fs.Parse(nil); err == nil || !strings.Contains(err.Error(), `environment variable NODEPLUG_WATCHER_WATCH_STREAMS=""`) {
		t.Errorf("an empty variable of a number flag: %v", err)
	}
}

type nopWriter struct{}

func (nopWriter) Write(p []byte) (int, error) { return len(p), nil }
