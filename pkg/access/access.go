// Package access is nodeplug's API access policy: who a caller is (Unix
// peer credentials on the API socket, a client certificate over TCP), which
// role that gives it, and which role each method needs.
//
// Roles are cumulative: internal ⊃ operator ⊃ reader.
//   - reader: List*, Watch*, health and reflection — anyone who can connect
//     to the API socket (its file mode decides who can);
//   - operator: Allocate, Release, StartContainer and PrepareResources — root, the
//     service's own uid and members of the operator group;
//   - internal: RegisterPlugin, DeregisterPlugin and any method not named
//     above — root and the service's own uid only.
//
// Over TCP the roles come from the client certificate's Organization values
// (nodeplug:reader, nodeplug:operator, nodeplug:internal); a certificate with
// none of them may call health only.
package access

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Role is what a caller may do. Roles are ordered: a higher role may do
// everything a lower one may.
type Role int

// The roles, lowest first.
const (
	// RoleNone may call health only.
	RoleNone Role = iota
	// RoleReader may list and watch.
	RoleReader
	// RoleOperator may also allocate and release.
	RoleOperator
	// RoleInternal may also register and deregister plugins.
	RoleInternal
)

// String returns the role's name as it appears in certificates, without the
// "nodeplug:" prefix.
func (r Role) String() string {
	switch r {
	case RoleReader:
		return "reader"
	case RoleOperator:
		return "operator"
	case RoleInternal:
		return "internal"
	default:
		return "none"
	}
}

// OrgPrefix prefixes a role's name in a client certificate's Organization.
const OrgPrefix = "nodeplug:"

// RoleFromOrganizations returns the highest role named by a certificate's
// Organization values (RoleNone when none names a role).
func RoleFromOrganizations(orgs []string) Role {
	best := RoleNone
	for _, o := range orgs {
		var r Role
		switch o {
		case OrgPrefix + "reader":
			r = RoleReader
		case OrgPrefix + "operator":
			r = RoleOperator
		case OrgPrefix + "internal":
			r = RoleInternal
		default:
			continue
		}
		if r > best {
			best = r
		}
	}
	return best
}

// Required returns the role a full gRPC method name ("/pkg.Service/Method")
// needs. Unknown methods need the highest role, so a new method is closed
// until it is placed.
func Required(fullMethod string) Role {
	svc, method, _ := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	switch {
	case svc == "grpc.health.v1.Health":
		return RoleNone
	case strings.HasPrefix(svc, "grpc.reflection."):
		return RoleReader
	case strings.HasPrefix(method, "List"), strings.HasPrefix(method, "Watch"):
		return RoleReader
	case method == "Allocate", method == "Release", method == "PrepareResources", method == "StartContainer", method == "ReleasePodClaims":
		return RoleOperator
	default:
		return RoleInternal
	}
}

// Caller is the identity of one connection's peer.
type Caller struct {
	// Unix is set for callers on a Unix socket.
	Unix *UnixCred
	// Subject is the client certificate's subject for TLS callers.
	Subject string
	// Role is the caller's role.
	Role Role
}

// String describes the caller for errors and logs.
func (c Caller) String() string {
	if c.Unix != nil {
		return fmt.Sprintf("uid %d", c.Unix.UID)
	}
	if c.Subject != "" {
		return fmt.Sprintf("certificate %q", c.Subject)
	}
	return "an unidentified caller"
}

// authInfo carries a Caller as the connection's credentials.AuthInfo.
type authInfo struct {
	credentials.CommonAuthInfo
	caller Caller
}

func (a authInfo) AuthType() string {
	if a.caller.Unix != nil {
		return "unix-peercred"
	}
	return "tls"
}

// CallerFrom returns the caller of the call in ctx, as identified by the
// transport credentials of this package (ok is false otherwise).
func CallerFrom(ctx context.Context) (Caller, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return Caller{}, false
	}
	if a, ok := p.AuthInfo.(authInfo); ok {
		return a.caller, true
	}
	return Caller{}, false
}

// Guard enforces the policy on every call. It is safe for concurrent use.
type Guard struct {
	log    *slog.Logger
	denied *prometheus.CounterVec
	// open lets every caller through with the internal role: the plain
	// TCP listener for tests (--insecure-tcp), which has no identity.
	open bool
}

// NewGuard returns a Guard logging refusals to log and counting them in
// nodeplug_api_denied_total{method} on reg (when reg is not nil).
func NewGuard(log *slog.Logger, reg prometheus.Registerer) *Guard {
	g := &Guard{
		log: log,
		denied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeplug_api_denied_total",
			Help: "API calls refused for lack of a role, by method.",
		}, []string{"method"}),
	}
	if reg != nil {
		reg.MustRegister(g.denied)
	}
	return g
}

// AllowUnidentified lets calls without an identity through with the
// internal role. Only the plain TCP listener for tests uses it.
func (g *Guard) AllowUnidentified() { g.open = true }

// check returns nil when the caller in ctx may call method, else a
// PERMISSION_DENIED status naming the method and the caller.
func (g *Guard) check(ctx context.Context, method string) error {
	need := Required(method)
	caller, ok := CallerFrom(ctx)
	if need == RoleNone || (!ok && g.open) {
		return nil
	}
	if ok && caller.Role >= need {
		return nil
	}
	// method is a registered method's name: the server answers
	// Unimplemented for unknown ones before interceptors run, so the label
	// set is bounded.
	g.denied.WithLabelValues(method).Inc()
	attrs := []any{"method", method, "need", need.String(), "role", caller.Role.String()}
	if caller.Unix != nil {
		attrs = append(attrs, "uid", caller.Unix.UID, "gid", caller.Unix.GID, "pid", caller.Unix.PID)
	} else if caller.Subject != "" {
		attrs = append(attrs, "subject", caller.Subject)
	}
	g.log.WarnContext(ctx, "API call refused", attrs...)
	return status.Errorf(codes.PermissionDenied, "permission denied: %s needs the %s role; %s has the %s role",
		method, need, caller, caller.Role)
}

// Unary is the unary server interceptor of the policy.
func (g *Guard) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := g.check(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// Stream is the stream server interceptor of the policy.
func (g *Guard) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := g.check(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}
