package claims

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	resourcev1 "k8s.io/api/resource/v1"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/telemetry"
	"github.com/nodeplug/nodeplug/services/internal/keylock"
	"github.com/nodeplug/nodeplug/services/internal/store"
)

var tracer = telemetry.Tracer("github.com/nodeplug/nodeplug/services/dramanager/claims")

// Retry bounds of an owed unprepare (and of an owed Unreserve): the
// first retry after RetryInitial, doubling up to RetryMax.
const (
	DefaultRetryInitial = 500 * time.Millisecond
	DefaultRetryMax     = 30 * time.Second
)

// Config configures a Manager.
type Config struct {
	Reserver Reserver
	Drivers  Drivers
	// Journal is the dramanager's store, wrapped (NewJournal) and loaded
	// (Journal.Load, and Import at a first start) before New is called.
	Journal *Journal
	// AllocatedHere tells a claim this node allocated (it is recorded;
	// Reserver.Unreserve deallocates such a claim after its last pod).
	AllocatedHere func(*resourcev1.ResourceClaim) bool
	Log           *slog.Logger
	// Registerer receives the metrics; nil means none are registered.
	Registerer             prometheus.Registerer
	RetryInitial, RetryMax time.Duration
}

// Manager prepares the claims of pods on this node (see the package
// comment). Every method is safe for concurrent use.
//
// Concurrency: the work on one claim is serialised by its namespace and
// name (locks, taken in sorted order when a pod has several claims);
// mu guards the records and is never held across I/O. A record in memory
// changes only after its journal record is durable.
type Manager struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	locks   keylock.Mutex

	mu      sync.Mutex
	records map[string]*record     // by claim UID
	byName  map[string]string      // namespace/name → UID
	intents map[string]store.Claim // by store.IntentKey (intents.go)
	working map[string]bool        // UIDs and intent keys with a retry loop running

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// record is a claim recorded on this node: its journal record, and the
// last failed unprepare.
type record struct {
	rec       store.Claim
	lastError string
}

// New restores the claims and intents the journal holds and starts the
// retry loops of the unprepares (and reservation removals) they owe, and
// of the rollbacks the intents owe. Close stops them.
func New(cfg Config) (*Manager, error) {
	if cfg.Reserver == nil || cfg.Drivers == nil || cfg.Journal == nil {
		return nil, fmt.Errorf("claims: a Reserver, Drivers and a Journal are required: %w", errdefs.ErrInvalidArgument)
	}
	saved, loaded := cfg.Journal.Saved()
	if !loaded {
		return nil, fmt.Errorf("claims: the journal was not loaded (Journal.Load comes first): %w", errdefs.ErrFailedPrecondition)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.RetryInitial <= 0 {
		cfg.RetryInitial = DefaultRetryInitial
	}
	if cfg.RetryMax < cfg.RetryInitial {
		cfg.RetryMax = max(DefaultRetryMax, cfg.RetryInitial)
	}
	m := &Manager{cfg: cfg, log: cfg.Log, records: map[string]*record{}, byName: map[string]string{}, intents: map[string]store.Claim{}, working: map[string]bool{}}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	m.metrics = newMetrics(cfg.Registerer, m)
	m.restore(saved)
	return m, nil
}

// restore takes in the records and intents saved and starts the work
// they owe.
func (m *Manager) restore(saved []store.Claim) {
	for _, c := range saved {
		if c.State == store.ClaimIntent {
			m.intents[c.UID] = c
			continue
		}
		m.records[c.UID] = &record{rec: c}
		m.byName[key(c.Namespace, c.Name)] = c.UID
	}
	var owed []string
	for _, c := range saved {
		if c.State == store.ClaimIntent || owes(c) {
			owed = append(owed, c.UID)
		}
	}
	if len(saved) > 0 {
		m.log.Info("prepared claims restored", "claims", len(m.records), "intents", len(m.intents), "owing_work", len(owed))
	}
	for _, uid := range owed { // the loops take m.mu from here on
		m.kick(uid)
	}
}

// Close stops the retry loops; what they owe stays recorded and a later
// Manager over the same journal resumes it.
func (m *Manager) Close() {
	m.cancel()
	m.wg.Wait()
}

// List returns the claims recorded on this node, by namespace and name.
func (m *Manager) List() []Claim {
	m.mu.Lock()
	out := make([]Claim, 0, len(m.records))
	for _, r := range m.records {
		out = append(out, r.claim())
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b Claim) int {
		return strings.Compare(key(a.Ref.Namespace, a.Ref.Name), key(b.Ref.Namespace, b.Ref.Name))
	})
	return out
}

// PodClaims returns the claims pod uses, by namespace and name.
func (m *Manager) PodClaims(podUID string) []Claim {
	var out []Claim
	for _, c := range m.List() {
		if slices.Contains(c.Pods, podUID) {
			out = append(out, c)
		}
	}
	return out
}

func (r *record) claim() Claim {
	c := Claim{
		Ref:    ClaimRef{Namespace: r.rec.Namespace, Name: r.rec.Name, UID: r.rec.UID},
		Driver: strings.Join(r.rec.Drivers, ","), State: StatePrepared, AllocatedHere: r.rec.AllocatedHere,
		LastError: r.lastError, Devices: devicesOf(r.rec.Devices), Pods: make([]string, 0, len(r.rec.Pods)),
	}
	if r.rec.State == store.ClaimUnpreparing {
		c.State = StateUnpreparing
	}
	for _, p := range r.rec.Pods {
		c.Pods = append(c.Pods, p.UID)
	}
	return c
}

func devicesOf(ds []store.ClaimDevice) []Device {
	out := make([]Device, 0, len(ds))
	for _, d := range ds {
		out = append(out, Device{Requests: slices.Clone(d.Requests), Driver: d.Driver, Pool: d.Pool, Device: d.Device, CDIDeviceIDs: slices.Clone(d.CDIDeviceIDs)})
	}
	return out
}

func key(namespace, name string) string { return namespace + "/" + name }

// lookup returns a copy of the record of namespace/name, if any.
func (m *Manager) lookup(namespace, name string) (store.Claim, string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	uid, ok := m.byName[key(namespace, name)]
	if !ok {
		return store.Claim{}, "", false
	}
	r := m.records[uid]
	return cloneRec(r.rec), r.lastError, true
}

// commit makes puts and removals durable, then applies them in memory.
func (m *Manager) commit(put []store.Claim, removed []string) error {
	if len(put)+len(removed) == 0 {
		return nil
	}
	if err := m.cfg.Journal.commit(put, removed); err != nil {
		return fmt.Errorf("record claims: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, uid := range removed {
		delete(m.intents, uid)
		if r := m.records[uid]; r != nil {
			if m.byName[key(r.rec.Namespace, r.rec.Name)] == uid {
				delete(m.byName, key(r.rec.Namespace, r.rec.Name))
			}
			delete(m.records, uid)
		}
	}
	for _, c := range put {
		if c.State == store.ClaimIntent {
			m.intents[c.UID] = cloneRec(c)
			continue
		}
		if old := m.records[c.UID]; old != nil {
			old.rec = cloneRec(c)
			continue
		}
		if stale, ok := m.byName[key(c.Namespace, c.Name)]; ok && stale != c.UID {
			// A claim recreated under the name of one still unpreparing:
			// both stay recorded, the name finds the newer.
			m.log.Info("claim recorded under a name another UID holds", "claim", key(c.Namespace, c.Name), "uid", c.UID, "older_uid", stale)
		}
		m.records[c.UID] = &record{rec: cloneRec(c)}
		m.byName[key(c.Namespace, c.Name)] = c.UID
	}
	return nil
}

func cloneRec(c store.Claim) store.Claim {
	c.Drivers = slices.Clone(c.Drivers)
	c.Devices = slices.Clone(c.Devices)
	c.Pods = slices.Clone(c.Pods)
	c.Released = slices.Clone(c.Released)
	return c
}

type metrics struct {
	prepares   *prometheus.CounterVec
	unprepares *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, m *Manager) *metrics {
	mt := &metrics{
		prepares: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeplug_dramanager_claim_prepares_total",
			Help: "Prepare calls per result: prepared (a driver was called), reused (every claim already prepared for the pod) or failed.",
		}, []string{"result"}),
		unprepares: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeplug_dramanager_claim_unprepares_total",
			Help: "NodeUnprepareResources attempts per driver and result (ok, failed); a failed one is retried with backoff.",
		}, []string{"driver", "result"}),
	}
	if reg != nil {
		claims := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "nodeplug_dramanager_claims",
			Help: "DRA claims recorded on this node (prepared or unpreparing).",
		}, func() float64 {
			m.mu.Lock()
			defer m.mu.Unlock()
			return float64(len(m.records))
		})
		intents := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "nodeplug_dramanager_claim_intents",
			Help: "Reservations of DRA claims whose prepare is neither committed nor rolled back: in flight, or a rollback owed after a failure or a restart.",
		}, func() float64 { return float64(m.Intents()) })
		reg.MustRegister(mt.prepares, mt.unprepares, claims, intents)
	}
	return mt
}
