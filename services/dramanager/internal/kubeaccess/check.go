package kubeaccess

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authzv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// The start check's log messages (a test of a real cluster waits for
// LogPermissionsChecked, with its "missing" count).
const (
	LogPermissionsChecked = "permissions checked"
	LogPermissionMissing  = "the dramanager lacks a permission on the Kubernetes API"
	LogCheckNotDone       = "cannot check the dramanager's permissions on the Kubernetes API yet; retrying with backoff"
)

// reviewTimeout bounds each review the check asks for.
const reviewTimeout = 10 * time.Second

// checkBackoff spaces the attempts of a check that could not be done; it
// holds at its cap and never gives up.
var checkBackoff = wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.2, Cap: 5 * time.Minute, Steps: 100}

// recheckBackoff spaces the checks made again while a permission is
// missing: a grant made after the start, or a kube-apiserver that had not
// loaded the cluster's roles yet when it answered (it refuses everything
// meanwhile), shows without a restart of the dramanager.
var recheckBackoff = wait.Backoff{Duration: 10 * time.Second, Factor: 2, Jitter: 0.2, Cap: 5 * time.Minute, Steps: 100}

// Missing asks the API which of rules the client lacks: one
// SelfSubjectAccessReview (authorization.k8s.io/v1, which every
// authenticated user may create) per rule, in every namespace (the
// empty namespace), in order. An error means the check could not be
// done (the API unreachable, a review refused).
func Missing(ctx context.Context, client kubernetes.Interface, rules []Rule) ([]Rule, error) {
	var missing []Rule
	for _, r := range rules {
		rctx, cancel := context.WithTimeout(ctx, reviewTimeout)
		res, err := client.AuthorizationV1().SelfSubjectAccessReviews().Create(rctx, &authzv1.SelfSubjectAccessReview{
			Spec: authzv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authzv1.ResourceAttributes{
				Verb: r.Verb, Group: r.Group, Resource: r.Resource, Subresource: r.Subresource,
			}},
		}, metav1.CreateOptions{})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("SelfSubjectAccessReview of %s: %w", r, err)
		}
		if !res.Status.Allowed {
			missing = append(missing, r)
		}
	}
	return missing, nil
}

// CheckConfig configures a Checker.
type CheckConfig struct {
	Log *slog.Logger
	// Registerer receives nodeplug_dramanager_kubernetes_api_permission;
	// nil: no metrics.
	Registerer prometheus.Registerer
	// Done, when set, is called once the check has completed, with the
	// rules missing.
	Done func(missing []Rule)
	// Rules are checked (nil: Required); Backoff spaces the attempts of a
	// check that could not be done (zero: every second, doubling up to
	// five minutes); Recheck the checks made again while a rule is missing
	// (zero: after 10 seconds, doubling up to five minutes).
	Rules   []Rule
	Backoff wait.Backoff
	Recheck wait.Backoff
}

// Checker is the start check: it learns the dramanager's identity on a
// cluster's API (Review) and asks whether it holds every rule (Missing).
// A missing rule does not stop the dramanager, whose drivers and
// prepared claims need no API: it is logged, with what fails without it,
// and shown in the metrics and through Done.
type Checker struct {
	a     *Access
	cfg   CheckConfig
	log   *slog.Logger
	gauge *prometheus.GaugeVec
}

// NewChecker returns the start check of a's API.
func NewChecker(a *Access, cfg CheckConfig) *Checker {
	if cfg.Rules == nil {
		cfg.Rules = Required
	}
	if cfg.Backoff.Duration == 0 {
		cfg.Backoff = checkBackoff
	}
	if cfg.Recheck.Duration == 0 {
		cfg.Recheck = recheckBackoff
	}
	c := &Checker{a: a, cfg: cfg, log: cfg.Log, gauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "nodeplug_dramanager_kubernetes_api_permission",
		Help: "Whether the cluster's API grants the dramanager's identity each permission it needs (1) or not (0), by verb, API group and resource[/subresource], as the last check found (none before the first completes, none with the node-local API; checked again while one is missing).",
	}, []string{"verb", "group", "resource"})}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(c.gauge)
	}
	return c
}

// Run checks in the background of a start: with the node-local API there
// is nothing to check (nodeplug-apiserver grants the dramanager's own
// certificate every verb, and serves no reviews) and Done is called with
// none missing at once; with a cluster's, an attempt that cannot be done
// is logged (the first time) and tried again with backoff until one
// completes. While a rule is missing, the check is made again (Recheck),
// and an outcome that differs is reported again (logged, in the metrics,
// Done): Run returns once nothing is missing, or when ctx ends. It returns
// nil.
func (c *Checker) Run(ctx context.Context) error {
	if c.a.Local {
		c.done(nil)
		return nil
	}
	missing, ok := c.check(ctx)
	if !ok {
		return nil
	}
	c.report(missing)
	delay := c.cfg.Recheck.DelayFunc()
	for len(missing) > 0 {
		t := time.NewTimer(delay())
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		now, err := Missing(ctx, c.a.Client, c.cfg.Rules)
		if err != nil {
			c.log.Debug(LogCheckNotDone, "error", err)
			continue
		}
		if !slices.Equal(now, missing) {
			c.report(now)
			missing = now
		}
	}
	return nil
}

// check makes the check, trying again with backoff until an attempt
// completes (ok) or ctx ends.
func (c *Checker) check(ctx context.Context) (missing []Rule, ok bool) {
	var warned, unnamed bool
	_ = c.cfg.Backoff.DelayFunc().Until(ctx, true, true, func(ctx context.Context) (bool, error) {
		if err := c.identify(ctx); err != nil && !answered(err) {
			warned = c.notDone(err, warned)
			return false, nil
		} else if err != nil && !unnamed {
			unnamed = true
			c.log.Warn("the Kubernetes API did not say who the dramanager is: its refusals name an identity not known", "error", err)
		}
		m, err := Missing(ctx, c.a.Client, c.cfg.Rules)
		if err != nil {
			warned = c.notDone(err, warned)
			return false, nil
		}
		missing, ok = m, true
		return true, nil
	})
	return missing, ok
}

// identify learns the identity (until it is known); an error the API
// answered leaves it not known, saying why.
func (c *Checker) identify(ctx context.Context) error {
	if _, _, ok := c.a.Identity.User(); ok {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, reviewTimeout)
	defer cancel()
	user, groups, err := Review(rctx, c.a.Client)
	if err != nil {
		if answered(err) {
			c.a.Identity.unknown(err.Error())
		}
		return err
	}
	c.a.Identity.set(user, groups)
	return nil
}

// answered: the API answered err, and asking again would get the same
// answer (a 4xx other than 429).
func answered(err error) bool {
	var se apierrors.APIStatus
	if !errors.As(err, &se) {
		return false
	}
	code := se.Status().Code
	return code >= 400 && code < 500 && code != http.StatusTooManyRequests
}

// notDone logs an attempt that could not be done: at warn level the
// first time, then at debug level. It returns true.
func (c *Checker) notDone(err error, warned bool) bool {
	if warned {
		c.log.Debug(LogCheckNotDone, "error", err)
	} else {
		c.log.Warn(LogCheckNotDone, "server", c.a.Config.Host, "identity", c.a.Identity.String(), "error", err)
	}
	return true
}

// report logs and shows the outcome of a completed check.
func (c *Checker) report(missing []Rule) {
	id := c.a.Identity.String()
	lacks := map[string]bool{}
	for _, r := range missing {
		lacks[r.String()] = true
		c.log.Warn(LogPermissionMissing, "verb", r.Verb, "group", groupName(r.Group), "resource", r.Path(),
			"identity", id, "without_it", r.Without, "grant", Manifest)
	}
	for _, r := range c.cfg.Rules {
		v := 1.0
		if lacks[r.String()] {
			v = 0
		}
		c.gauge.WithLabelValues(r.Verb, r.Group, r.Path()).Set(v)
	}
	level := slog.LevelInfo
	if len(missing) > 0 {
		level = slog.LevelWarn
	}
	c.log.Log(context.Background(), level, LogPermissionsChecked, "identity", id, "checked", len(c.cfg.Rules), "missing", len(missing))
	c.done(missing)
}

func (c *Checker) done(missing []Rule) {
	if c.cfg.Done != nil {
		c.cfg.Done(missing)
	}
}
