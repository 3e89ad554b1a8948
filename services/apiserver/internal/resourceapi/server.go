// Package resourceapi is the node-local resource.k8s.io API: HTTPS on
// loopback, serving resource.k8s.io/v1 ResourceSlices, ResourceClaims
// (and their status) and DeviceClasses, and the one core v1 Node, with
// the list/watch semantics clients built on client-go rely on. It is not
// a general API server: it serves those kinds only, and older versions
// of the group answer 404 as a server without them does. Objects are
// encoded and decoded only with k8s.io/apimachinery's serializers and the
// k8s.io/api types, and kept durably in a Store.
package resourceapi

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodeplug/nodeplug/pkg/memory"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// DefaultBookmarkInterval is how often a watch that allows bookmarks gets
// one.
const DefaultBookmarkInterval = time.Minute

// Config configures a Server.
type Config struct {
	Store *Store
	// NodeName is the one Node served; a driver writes only its slices.
	NodeName string
	Log      *slog.Logger
	// Registerer takes the request metrics (nil: not registered).
	Registerer prometheus.Registerer
	// BookmarkInterval: 0 means DefaultBookmarkInterval.
	BookmarkInterval time.Duration
}

// Server serves the API.
type Server struct {
	cfg     Config
	store   *Store
	log     *slog.Logger
	metrics *metrics
	node    string
	watches *watchSlots
}

// NewServer makes the server and makes sure the Node exists (its UID,
// made once, stays across restarts).
func NewServer(cfg Config) (*Server, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("resource API: a node name is required")
	}
	if cfg.BookmarkInterval <= 0 {
		cfg.BookmarkInterval = DefaultBookmarkInterval
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, store: cfg.Store, log: cfg.Log, node: cfg.NodeName,
		metrics: newMetrics(cfg.Registerer, cfg.Store), watches: newWatchSlots(cfg.Store.Limits())}
	if err := s.ensureNamespaces(); err != nil {
		return nil, err
	}
	if err := s.ensureNode(); err != nil {
		return nil, err
	}
	return s, nil
}

// Serve serves HTTPS on lis with tlsCfg until ctx ends; open watches end
// with it.
func (s *Server) Serve(ctx context.Context, lis net.Listener, tlsCfg *tls.Config) error {
	base, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := &http.Server{
		Handler:           s,
		TLSConfig:         tlsCfg,
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return base },
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	done := make(chan error, 1)
	go func() { done <- srv.ServeTLS(lis, "", "") }()
	go s.expire(base)
	select {
	case err := <-done:
		return fmt.Errorf("resource API on %s: %w", lis.Addr(), err)
	case <-ctx.Done():
	}
	cancel()
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("resource API on %s: %w", lis.Addr(), err)
	}
	return nil
}

// request is what the URL and method say.
type request struct {
	verb        string
	kind        *kind
	namespace   string
	name        string
	subresource string
	user        user
}

// ServeHTTP authenticates, routes and counts every request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
	start := time.Now()
	req, err := s.route(r)
	if err == nil {
		req.user, err = authenticate(r)
	}
	if err == nil && req.kind == nil {
		s.serveDiscovery(rec, r)
	} else if err == nil {
		err = s.serveResource(rec, r, req)
	}
	if err != nil {
		s.writeError(rec, r, err)
	}
	s.metrics.observe(req, rec.code, time.Since(start))
}

// route parses the URL: discovery (kind nil) or a resource request. Any
// other path, including the group's older versions, is 404.
func (s *Server) route(r *http.Request) (request, error) {
	path := strings.Trim(r.URL.Path, "/")
	parts := strings.Split(path, "/")
	switch path {
	case "version", "api", "api/v1", "apis", "apis/resource.k8s.io", "apis/resource.k8s.io/v1", "healthz", "livez", "readyz":
		if r.Method != http.MethodGet {
			return request{}, apierrors.NewMethodNotSupported(kindNode.groupResource(), r.Method)
		}
		return request{verb: "get"}, nil
	}
	var rest []string
	switch {
	case len(parts) >= 3 && parts[0] == "api" && parts[1] == "v1":
		rest = parts[2:]
	case len(parts) >= 4 && parts[0] == "apis" && parts[1] == "resource.k8s.io" && parts[2] == "v1":
		rest = parts[3:]
	default:
		return request{}, notFound()
	}
	req := request{}
	if len(rest) >= 3 && rest[0] == "namespaces" {
		req.namespace, rest = rest[1], rest[2:]
	}
	k := kindFor(parts[0] == "api", rest[0])
	if k == nil || len(rest) > 3 || (req.namespace != "" && !k.namespaced) {
		return request{}, notFound()
	}
	req.kind = k
	if len(rest) >= 2 {
		req.name = rest[1]
	}
	if len(rest) == 3 {
		if rest[2] != "status" || !k.hasStatus {
			return request{}, notFound()
		}
		req.subresource = "status"
	}
	if k.namespaced && req.namespace == "" && req.name != "" {
		return request{}, notFound()
	}
	verb, err := verbFor(r, req)
	req.verb = verb
	return req, err
}

func kindFor(core bool, resource string) *kind {
	for _, k := range allKinds {
		if k.resource == resource && (k.gvk.Group == "") == core {
			return k
		}
	}
	return nil
}

// verbFor maps method and URL to a Kubernetes verb.
func verbFor(r *http.Request, req request) (string, error) {
	named := req.name != ""
	switch {
	case r.Method == http.MethodGet && named:
		return "get", nil
	case r.Method == http.MethodGet && r.URL.Query().Get("watch") == "true":
		return "watch", nil
	case r.Method == http.MethodGet:
		return "list", nil
	case r.Method == http.MethodPost && !named && req.subresource == "":
		return "create", nil
	case r.Method == http.MethodPut && named:
		return "update", nil
	case r.Method == http.MethodPatch && named:
		return "patch", nil
	case r.Method == http.MethodDelete && named && req.subresource == "":
		return "delete", nil
	case r.Method == http.MethodDelete && !named:
		return "deletecollection", nil
	}
	return strings.ToLower(r.Method), apierrors.NewMethodNotSupported(req.kind.groupResource(), r.Method)
}

// notFound is what a real server answers for a path it does not serve
// (an unknown kind or an API version it lacks).
func notFound() error {
	return &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure, Code: http.StatusNotFound, Reason: metav1.StatusReasonNotFound,
		Message: "the server could not find the requested resource", Details: &metav1.StatusDetails{},
	}}
}

// serveResource checks the role, then runs the verb.
func (s *Server) serveResource(w http.ResponseWriter, r *http.Request, req request) error {
	if !allowed(req.user, req.verb, req.kind, req.subresource) {
		return forbidden(req.user, req.verb, req.kind, req.name, "not allowed for its role")
	}
	if (!req.kind.writable && !isRead(req.verb)) || !slices.Contains(req.kind.verbs, req.verb) {
		return apierrors.NewMethodNotSupported(req.kind.groupResource(), req.verb)
	}
	switch req.verb {
	case "get":
		return s.get(w, r, req)
	case "list":
		return s.list(w, r, req)
	case "watch":
		return s.watch(w, r, req)
	case "create":
		return s.create(w, r, req)
	case "update":
		return s.update(w, r, req)
	case "patch":
		return s.patch(w, r, req)
	case "delete":
		return s.delete(w, r, req)
	case "deletecollection":
		return s.deleteCollection(w, r, req)
	}
	return apierrors.NewMethodNotSupported(req.kind.groupResource(), req.verb)
}

func isRead(verb string) bool { return verb == "get" || verb == "list" || verb == "watch" }

// readBody reads a request body of at most MaxBodyBytes: one that says
// it is larger is 413 unread, one that turns out larger is 413 once the
// limit is read.
func readBody(r *http.Request) ([]byte, error) {
	tooLarge := apierrors.NewRequestEntityTooLargeError(fmt.Sprintf("limit is %d bytes", MaxBodyBytes))
	if r.ContentLength > MaxBodyBytes {
		return nil, tooLarge
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	if err != nil {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("reading the request body: %v", err))
	}
	if len(data) > MaxBodyBytes {
		return nil, tooLarge
	}
	return data, nil
}

// decodeBody decodes a request body (JSON or YAML, by Content-Type) into
// a new object of k: 400 for anything else, for garbage, or for another
// kind. fieldValidation=Strict refuses unknown and duplicate fields.
func decodeBody(r *http.Request, k *kind, data []byte) (runtime.Object, error) {
	info, err := serializerFor(r.Header.Get("Content-Type"))
	if err != nil {
		return nil, err
	}
	dec := info.Serializer
	if r.URL.Query().Get("fieldValidation") == "Strict" && info.StrictSerializer != nil {
		dec = info.StrictSerializer
	}
	def := k.gvk
	obj, gvk, err := dec.Decode(data, &def, k.newObj())
	if err != nil {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("the body of the request could not be decoded as %s: %v", k.gvk.Kind, err))
	}
	if *gvk != k.gvk {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("the body holds %s, not %s", gvk, k.gvk))
	}
	return obj, nil
}

// serializerFor picks the decoder for a Content-Type: JSON (the
// default), YAML or protobuf (client-go's typed clients send protobuf);
// anything else is 415.
func serializerFor(contentType string) (runtime.SerializerInfo, error) {
	mt, _, _ := strings.Cut(contentType, ";")
	mt = strings.TrimSpace(mt)
	if mt == "" {
		mt = runtime.ContentTypeJSON
	}
	if info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), mt); ok {
		return info, nil
	}
	return runtime.SerializerInfo{}, unsupportedMediaType(mt)
}

// writeObject encodes obj (its apiVersion and kind set) as the response.
func (s *Server) writeObject(w http.ResponseWriter, code int, obj runtime.Object) {
	data, err := runtime.Encode(jsonSerializer, obj)
	if err != nil {
		s.log.Error("resource API: encode response", "error", err)
		code = http.StatusInternalServerError
		data, _ = runtime.Encode(jsonSerializer, statusOf(apierrors.NewInternalError(err)))
	}
	w.Header().Set("Content-Type", runtime.ContentTypeJSON)
	w.WriteHeader(code)
	_, _ = w.Write(data)
}

// statusOf is err as the Status a client decodes.
func statusOf(err error) *metav1.Status {
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		st = apierrors.NewInternalError(err)
	}
	out := st.Status()
	out.Kind, out.APIVersion = "Status", "v1"
	return &out
}

func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	st := statusOf(err)
	if st.Code >= 500 {
		s.log.Warn("resource API request failed", "method", r.Method, "path", r.URL.Path, "error", err)
	}
	s.writeObject(w, int(st.Code), st)
}

// statusRecorder keeps the response code for the metrics, and lets a
// watch flush.
type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.code = code
	s.ResponseWriter.WriteHeader(code)
}

// Unwrap lets an http.ResponseController reach the connection (a watch
// sets a write deadline through it to end a blocked write).
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// expireEvery is how often the history's age is enforced.
const expireEvery = 5 * time.Second

// giveBackAfter is how much an expiry must drop for the freed memory to
// be returned to the OS at once.
const giveBackAfter = 4 << 20

// expire drops the history's changes older than its age until ctx ends;
// after a large drop it returns the memory to the OS (an idle process
// would otherwise keep it: the Go runtime returns memory only after a
// collection, which an idle process rarely runs).
func (s *Server) expire(ctx context.Context) {
	t := time.NewTicker(expireEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.expireEvents(time.Now())
		if dropped := s.store.Expire(time.Now()); dropped >= giveBackAfter {
			before, after := memory.Release()
			s.log.Info("resource API watch history expired; memory returned to the OS", "dropped_bytes", dropped,
				"retained_before", before, "retained_after", after)
		}
	}
}

// ResourceVersion is the last resourceVersion the server gave out.
func (s *Server) ResourceVersion() uint64 { return s.store.ResourceVersion() }
