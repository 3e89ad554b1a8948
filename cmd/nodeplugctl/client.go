package main

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/layout"
)

// service names one of nodeplug's services and the flag that addresses it.
type service struct {
	name string
	flag string
	set  func(*globals) string // the flag's value, "" when not given
}

// addr is the address of svc: its flag, else its API socket under the root
// dir.
func (svc service) addr(g *globals) string {
	if a := svc.set(g); a != "" {
		return a
	}
	return layout.APISocket(g.rootDir, svc.name)
}

// whereHint says where svc's address came from and how to change it, for
// a service that cannot be reached: the root dir it was looked for under,
// and the variable that sets it in a shell without the export, or svc's
// own flag.
func (svc service) whereHint(g *globals) string {
	if svc.set(g) != "" {
		return "make run; or check " + svc.flag
	}
	return fmt.Sprintf("make run; its socket is looked for under the root dir %s, which --root-dir or NODEPLUG_ROOT_DIR sets (make run prints the export); or set %s", g.rootDir, svc.flag)
}

var (
	watcherSvc       = service{"watcher", "--watcher-addr", func(g *globals) string { return g.watcherAddr }}
	reconcilerSvc    = service{"reconciler", "--reconciler-addr", func(g *globals) string { return g.reconcilerAddr }}
	devicemanagerSvc = service{"devicemanager", "--devicemanager-addr", func(g *globals) string { return g.devicemanagerAddr }}
	dramanagerSvc    = service{"dramanager", "--dramanager-addr", func(g *globals) string { return g.dramanagerAddr }}
)

// conn returns a (lazy) connection to svc; connections are reused within one
// command and closed when it ends.
func (c *cli) conn(svc service) (*grpc.ClientConn, error) {
	addr := svc.addr(&c.g)
	if cc, ok := c.conns[addr]; ok {
		return cc, nil
	}
	cc, err := c.g.tls.Dial(addr)
	if err != nil {
		return nil, fmt.Errorf("bad %s address %q: %v (set %s, or --root-dir)", svc.name, addr, err, svc.flag)
	}
	c.conns[addr] = cc
	return cc, nil
}

func (c *cli) close() {
	for _, cc := range c.conns {
		_ = cc.Close()
	}
}

// call returns a context bounded by --timeout for one unary call.
func (c *cli) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.g.timeout)
}

// rpcError says what failed and what to try. A status a nodeplug service
// made carries an ErrorInfo (errdefs.InfoOf): the service answered, so its
// UNAVAILABLE is never "cannot reach" it, and a reason that blames a DRA
// driver or a device plugin is said as its fault. Only a status without one, from
// the transport, can mean the service is not reached.
func (c *cli) rpcError(svc service, op string, err error) error {
	addr := svc.addr(&c.g)
	st := status.Convert(err)
	msg := st.Message()
	info, answered := errdefs.InfoOf(err)
	if answered {
		if derr := peerFault(svc.name, op, msg, info); derr != nil {
			return derr
		}
	}
	switch st.Code() {
	case codes.Unavailable:
		switch {
		case answered:
		case strings.Contains(msg, "permission denied"):
			return fmt.Errorf("may not open the %s's socket %s: %s — the API is for root, the service's user and its --api-group (docs/security.md)", svc.name, addr, msg)
		case isConnectError(msg):
			return fmt.Errorf("cannot reach the %s at %s: %s — is it running? (%s)", svc.name, addr, msg, svc.whereHint(&c.g))
		}
		return fmt.Errorf("%s: %s (the %s at %s says: unavailable)", op, msg, svc.name, addr)
	case codes.DeadlineExceeded:
		return fmt.Errorf("%s: the %s at %s did not answer within %s — is it healthy? (or raise --timeout)", op, svc.name, addr, c.g.timeout)
	case codes.Unimplemented:
		return fmt.Errorf("%s: %s at %s does not serve this call — is %s the %s's address? (%s)", op, "the service", addr, addr, svc.name, svc.flag)
	case codes.Canceled:
		return fmt.Errorf("%s: canceled", op)
	case codes.PermissionDenied:
		if answered && info.GetReason() == errdefs.ReasonKubernetesAPIDenied {
			// The cluster's API refused the service's identity: its RBAC,
			// not nodeplug's own roles.
			return fmt.Errorf("%s: %s (docs/dra-drivers.md#with-a-cluster)", op, msg)
		}
		return fmt.Errorf("%s: %s (docs/security.md)", op, msg)
	case codes.InvalidArgument, codes.NotFound, codes.FailedPrecondition, codes.AlreadyExists, codes.ResourceExhausted:
		return fmt.Errorf("%s: %s", op, msg)
	default:
		return fmt.Errorf("%s: %s (%s from the %s at %s)", op, msg, st.Code(), svc.name, addr)
	}
}

// peerFault says an error whose reason blames a DRA driver or a device
// plugin as its fault, naming it and its socket, and svc, the service
// that answered, as the one not at fault; nil for other reasons.
func peerFault(svc, op, msg string, info *errdetails.ErrorInfo) error {
	md := info.GetMetadata()
	driver, socket := md[errdefs.MetaDriver], md[errdefs.MetaSocket]
	said := fmt.Sprintf("\n  the %s said: %s", svc, msg)
	switch info.GetReason() {
	case errdefs.ReasonDRADriverUnreachable:
		return fmt.Errorf("%s: DRA driver %s is not reachable at %s: the driver is at fault, not the %s — is the driver running? (nodeplugctl drivers)%s",
			op, driver, socket, svc, said)
	case errdefs.ReasonDRADriverFailed:
		return fmt.Errorf("%s: DRA driver %s (socket %s) failed: the driver is at fault, not the %s — see the driver's log%s",
			op, driver, socket, svc, said)
	case errdefs.ReasonDevicePluginUnreachable:
		return fmt.Errorf("%s: the device plugin of %s did not answer %s at %s: the plugin is at fault, not the %s — is the plugin running? (nodeplugctl plugins)%s",
			op, md[errdefs.MetaResource], md[errdefs.MetaCall], socket, svc, said)
	case errdefs.ReasonDevicePluginFailed:
		return fmt.Errorf("%s: the device plugin of %s (socket %s) failed %s: the plugin is at fault, not the %s — see the plugin's log%s",
			op, md[errdefs.MetaResource], socket, md[errdefs.MetaCall], svc, said)
	case errdefs.ReasonDRADriverNotRegistered:
		return fmt.Errorf("%s: DRA driver %s is not registered on this node — start it, or see why it did not register (nodeplugctl drivers)%s",
			op, driver, said)
	}
	return nil
}

// isConnectError tells a transport failure (nothing listening, wrong
// address) from an UNAVAILABLE answer of a running service.
func isConnectError(msg string) bool {
	for _, s := range []string{"connection refused", "connection error", "no such file", "dial", "name resolver", "connection reset", "EOF"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
