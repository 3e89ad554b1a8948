package kubeaccess

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/nodeplug/nodeplug/internal/testutil"
)

// standIn is an API server that answers the start check's reviews alone,
// deciding each SelfSubjectAccessReview as RBAC decides it from the
// rules of deploy/rbac/nodeplug.yaml's ClusterRole, less those a test
// withholds. It stands in for kube-apiserver, which no test of this
// module runs: nodeplug-apiserver serves no reviews, and test/upstream
// checks the dramanager against a real one (waiting for
// LogPermissionsChecked).
type standIn struct {
	srv *httptest.Server

	mu      sync.Mutex
	granted []string // Rule.String of each permission granted
	user    string
	groups  []string
	// reviewCode, when set, answers the SelfSubjectReview with that
	// status; failAccess answers that many access reviews 503 first.
	reviewCode int
	failAccess int
	accesses   int
}

func startStandIn(t *testing.T, granted []string) *standIn {
	t.Helper()
	s := &standIn{granted: granted, user: "nodeplug-dramanager:node-1", groups: []string{"nodeplug:dramanagers", "system:authenticated"}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /apis/authentication.k8s.io/v1/selfsubjectreviews", s.selfReview)
	mux.HandleFunc("POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews", s.accessReview)
	s.srv = httptest.NewServer(mux)
	t.Cleanup(s.srv.Close)
	return s
}

func (s *standIn) selfReview(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reviewCode != 0 {
		writeStatus(w, s.reviewCode, metav1.StatusReasonNotFound, "the server could not find the requested resource")
		return
	}
	writeJSON(w, &authnv1.SelfSubjectReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "authentication.k8s.io/v1", Kind: "SelfSubjectReview"},
		Status:   authnv1.SelfSubjectReviewStatus{UserInfo: authnv1.UserInfo{Username: s.user, Groups: s.groups}},
	})
}

func (s *standIn) accessReview(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, err.Error())
		return
	}
	var in authzv1.SelfSubjectAccessReview
	if _, _, err := scheme.Codecs.UniversalDeserializer().Decode(body, nil, &in); err != nil || in.Spec.ResourceAttributes == nil {
		writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprint("not a resource access review: ", err))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.accesses++
	if s.accesses <= s.failAccess {
		writeStatus(w, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, "the authorizer is not ready")
		return
	}
	a := in.Spec.ResourceAttributes
	if a.Namespace != "" {
		writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, "the check asks for every namespace")
		return
	}
	rule := Rule{Verb: a.Verb, Group: a.Group, Resource: a.Resource, Subresource: a.Subresource}
	in.Status.Allowed = slices.Contains(s.granted, rule.String())
	in.TypeMeta = metav1.TypeMeta{APIVersion: "authorization.k8s.io/v1", Kind: "SelfSubjectAccessReview"}
	writeJSON(w, &in)
}

func writeJSON(w http.ResponseWriter, obj any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(obj)
}

func writeStatus(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(&metav1.Status{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"},
		Status: metav1.StatusFailure, Code: int32(code), Reason: reason, Message: msg})
}

// open opens the stand-in through a kubeconfig naming it, as
// --kubeconfig does.
func (s *standIn) open(t *testing.T) *Access {
	t.Helper()
	dir := testutil.TempDir(t)
	path := filepath.Join(dir, "kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q}}]
users: [{name: u, user: {token: secret}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, s.srv.URL)
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := Open(Options{RootDir: dir, Kubeconfig: path, NodeName: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// records keeps the log records of a check.
type records struct {
	mu   sync.Mutex
	list []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.list = append(r.list, rec.Clone())
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

// with returns the records of msg, each as its level and attributes.
func (r *records) with(msg string) []map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []map[string]string
	for _, rec := range r.list {
		if rec.Message != msg {
			continue
		}
		m := map[string]string{"level": rec.Level.String()}
		rec.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
		out = append(out, m)
	}
	return out
}

var fastBackoff = wait.Backoff{Duration: time.Millisecond, Factor: 2, Cap: 4 * time.Millisecond, Steps: 3}

// runCheck runs a's check until its first outcome and returns the rules
// it found missing; the checks made again while one is missing end with
// it.
func runCheck(t *testing.T, a *Access, log *records, reg prometheus.Registerer) []Rule {
	t.Helper()
	done := make(chan []Rule, 1)
	c := NewChecker(a, CheckConfig{Log: slog.New(log), Registerer: reg, Backoff: fastBackoff,
		Done: func(missing []Rule) {
			select {
			case done <- missing:
			default:
			}
		}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	defer cancel()
	var missing []Rule
	select {
	case missing = <-done:
		cancel()
		if err := <-ran; err != nil {
			t.Fatal(err)
		}
	case err := <-ran:
		// Run returns right after an outcome with nothing missing (or
		// the node-local API's): Done was called before it returned.
		if err != nil {
			t.Fatal(err)
		}
		select {
		case missing = <-done:
		default:
			t.Fatal("Run returned before the check completed")
		}
	}
	return missing
}

// TestCheckFindsWhatIsMissing: against the manifest's rules the check
// finds nothing missing; without resourceclaims/binding and the slices'
// deletecollection it finds those two, logs each at warn level naming
// the verb, the resource and the identity, and shows them in the metrics.
func TestCheckFindsWhatIsMissing(t *testing.T) {
	all := grants(t, readManifest(t, Manifest).role.Rules)
	binding := Rule{Verb: "update", Group: resourceGroup, Resource: "resourceclaims", Subresource: "binding"}
	wipe := Rule{Verb: "deletecollection", Group: resourceGroup, Resource: "resourceslices"}
	for _, tc := range []struct {
		name     string
		withheld []Rule
	}{
		{name: "the manifest's rules"},
		{name: "without binding and deletecollection", withheld: []Rule{wipe, binding}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			granted := slices.DeleteFunc(slices.Clone(all), func(g string) bool {
				return slices.ContainsFunc(tc.withheld, func(r Rule) bool { return r.String() == g })
			})
			s := startStandIn(t, granted)
			a := s.open(t)
			log, reg := &records{}, prometheus.NewRegistry()
			missing := runCheck(t, a, log, reg)

			var got, want []string
			for _, r := range missing {
				got = append(got, r.String())
			}
			for _, r := range Required { // in the table's order
				if slices.ContainsFunc(tc.withheld, func(w Rule) bool { return w.String() == r.String() }) {
					want = append(want, r.String())
				}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("missing %q, want %q", got, want)
			}
			identity := `user "nodeplug-dramanager:node-1" (groups nodeplug:dramanagers, system:authenticated)`
			if a.Identity.String() != identity {
				t.Errorf("identity %s, want %s", a.Identity, identity)
			}
			checked := log.with(LogPermissionsChecked)
			if len(checked) != 1 || checked[0]["missing"] != fmt.Sprint(len(want)) || checked[0]["checked"] != fmt.Sprint(len(Required)) || checked[0]["identity"] != identity {
				t.Errorf("%q logged %v, want once with missing=%d checked=%d identity=%s", LogPermissionsChecked, checked, len(want), len(Required), identity)
			}
			warned := log.with(LogPermissionMissing)
			if len(warned) != len(want) {
				t.Fatalf("%q logged %d times, want %d", LogPermissionMissing, len(warned), len(want))
			}
			for i, w := range warned {
				r := missing[i]
				if w["level"] != "WARN" || w["verb"] != r.Verb || w["resource"] != r.Path() || w["identity"] != identity || w["without_it"] != r.Without {
					t.Errorf("warning %v, want WARN naming %s, the identity and what fails", w, r)
				}
			}
			families, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range Required {
				m := testutil.FindMetric(families, "nodeplug_dramanager_kubernetes_api_permission", map[string]string{"verb": r.Verb, "group": r.Group, "resource": r.Path()})
				v, ok := testutil.MetricValue(m)
				wantV := 1.0
				if slices.Contains(want, r.String()) {
					wantV = 0
				}
				if !ok || v != wantV {
					t.Errorf("nodeplug_dramanager_kubernetes_api_permission for %s: %v (found %v), want %v", r, v, ok, wantV)
				}
			}
		})
	}
}

// TestCheckRetriesUntilDone: access reviews the API cannot answer yet
// (503) are logged once, at warn level, and the check is tried again
// until it completes; a SelfSubjectReview the API does not serve leaves
// the identity not known, saying why, without failing the check.
func TestCheckRetriesUntilDone(t *testing.T) {
	s := startStandIn(t, grants(t, readManifest(t, Manifest).role.Rules))
	s.failAccess, s.reviewCode = 3, http.StatusNotFound
	a := s.open(t)
	log := &records{}
	if missing := runCheck(t, a, log, nil); len(missing) != 0 {
		t.Fatalf("missing %v, want none", missing)
	}
	notDone := log.with(LogCheckNotDone)
	warned := slices.DeleteFunc(slices.Clone(notDone), func(m map[string]string) bool { return m["level"] != "WARN" })
	if len(notDone) != 3 || len(warned) != 1 || warned[0]["error"] == "" {
		t.Errorf("%q logged %v, want three times, the first at warn level with the error", LogCheckNotDone, notDone)
	}
	if _, _, ok := a.Identity.User(); ok {
		t.Fatalf("identity %s, want one not known", a.Identity)
	}
	if id := a.Identity.String(); !strings.Contains(id, "SelfSubjectReview") || !strings.Contains(id, "could not find") {
		t.Errorf("identity %s: want why it is not known (the review's error)", id)
	}
	if c := log.with(LogPermissionsChecked); len(c) != 1 || c[0]["missing"] != "0" {
		t.Errorf("%q logged %v, want once with missing=0", LogPermissionsChecked, c)
	}
}

// TestCheckSeesAGrantLater: while a rule is missing the check is made
// again, so a grant made after the start (or roles an API server had not
// loaded yet when it first answered) shows without a restart: logged,
// in the metrics and through Done; Run then returns.
func TestCheckSeesAGrantLater(t *testing.T) {
	all := grants(t, readManifest(t, Manifest).role.Rules)
	binding := Rule{Verb: "update", Group: resourceGroup, Resource: "resourceclaims", Subresource: "binding"}
	s := startStandIn(t, slices.DeleteFunc(slices.Clone(all), func(g string) bool { return g == binding.String() }))
	log, reg := &records{}, prometheus.NewRegistry()
	outcomes := make(chan []Rule, 4)
	c := NewChecker(s.open(t), CheckConfig{Log: slog.New(log), Registerer: reg, Backoff: fastBackoff, Recheck: fastBackoff,
		Done: func(missing []Rule) { outcomes <- missing }})
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Deadline)
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	select {
	case first := <-outcomes:
		if len(first) != 1 || first[0].String() != binding.String() {
			t.Fatalf("first outcome %v, want %s missing", first, binding)
		}
	case <-ctx.Done():
		t.Fatal("the check never completed")
	}
	s.mu.Lock()
	s.granted = all
	s.mu.Unlock()
	select {
	case second := <-outcomes:
		if len(second) != 0 {
			t.Fatalf("after the grant: %v missing, want none", second)
		}
	case <-ctx.Done():
		t.Fatal("the grant was never seen")
	}
	if err := <-ran; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if c := log.with(LogPermissionsChecked); len(c) != 2 || c[0]["missing"] != "1" || c[1]["missing"] != "0" {
		t.Errorf("%q logged %v, want missing=1 then missing=0", LogPermissionsChecked, c)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	m := testutil.FindMetric(families, "nodeplug_dramanager_kubernetes_api_permission", map[string]string{"verb": "update", "group": resourceGroup, "resource": binding.Path()})
	if v, ok := testutil.MetricValue(m); !ok || v != 1 {
		t.Errorf("the granted rule's gauge: %v (found %v), want 1", v, ok)
	}
}

// TestCheckStopsWithItsContext: a check the API never lets complete ends
// when its context does, without calling Done.
func TestCheckStopsWithItsContext(t *testing.T) {
	s := startStandIn(t, nil)
	s.failAccess = 1 << 30
	var called bool
	c := NewChecker(s.open(t), CheckConfig{Backoff: fastBackoff, Done: func([]Rule) { called = true }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	testutil.WaitFor(t, "a few attempts", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.accesses > 3
	})
	cancel()
	if err := <-done; err != nil || called {
		t.Fatalf("Run: %v, Done called %v; want nil, not called", err, called)
	}
}

// TestCheckSkipsTheLocalAPI: with the node-local API (which serves no
// reviews and grants the dramanager's own certificate every verb) the
// check makes no request and finds nothing missing.
func TestCheckSkipsTheLocalAPI(t *testing.T) {
	a, err := Open(Options{RootDir: testutil.TempDir(t), NodeName: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	log := &records{}
	if missing := runCheck(t, a, log, nil); len(missing) != 0 {
		t.Fatalf("missing %v with the node-local API", missing)
	}
	if n := len(log.list); n != 0 {
		t.Errorf("the skipped check logged %d records", n)
	}
}
