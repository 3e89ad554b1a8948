package errdefs

import (
	"errors"
	"strings"
	"unicode"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Domain is the google.rpc.ErrorInfo domain of the statuses nodeplug's
// services return. ToGRPC gives every status it makes such a detail, so a
// client tells an answer of a running service (it has one) from a failure
// of the transport to reach it (it has none).
const Domain = "nodeplug.io"

// Reasons a service sets with WithReason when the fault lies with another
// party than the service answering; the metadata keys name that party.
const (
	// ReasonDRADriverUnreachable: a DRA driver's serving socket did not
	// answer (nothing listens, it died mid-call).
	ReasonDRADriverUnreachable = "DRA_DRIVER_UNREACHABLE"
	// ReasonDRADriverFailed: a DRA driver answered a call with an error,
	// or with an answer that is not valid.
	ReasonDRADriverFailed = "DRA_DRIVER_FAILED"
	// ReasonDRADriverNotRegistered: no instance of the DRA driver is
	// registered on the node.
	ReasonDRADriverNotRegistered = "DRA_DRIVER_NOT_REGISTERED"

	// ReasonDevicePluginUnreachable: a device plugin's endpoint did not
	// answer a call (nothing listens, it died mid-call, it took too long).
	ReasonDevicePluginUnreachable = "DEVICE_PLUGIN_UNREACHABLE"
	// ReasonDevicePluginFailed: a device plugin answered a call with an
	// error, or with an answer that is not valid.
	ReasonDevicePluginFailed = "DEVICE_PLUGIN_FAILED"

	// ReasonKubernetesAPIDenied: the Kubernetes API refused the
	// service's own identity a permission it needs (PERMISSION_DENIED);
	// MetaVerb, MetaGroup, MetaResource and MetaIdentity name it.
	ReasonKubernetesAPIDenied = "KUBERNETES_API_PERMISSION_DENIED"

	// MetaDriver, MetaResource, MetaSocket and MetaCall are metadata
	// keys: the DRA driver's name, the device plugin's resource (or the
	// Kubernetes resource[/subresource] refused), its socket, the call
	// that failed.
	MetaDriver   = "driver"
	MetaResource = "resource"
	MetaSocket   = "socket"
	MetaCall     = "call"
	// MetaVerb, MetaGroup and MetaIdentity are the verb and API group the
	// Kubernetes API refused, and to whom.
	MetaVerb     = "verb"
	MetaGroup    = "group"
	MetaIdentity = "identity"
)

// reasoned is an error with the ErrorInfo reason and metadata ToGRPC
// sends with it.
type reasoned struct {
	err      error
	reason   string
	metadata map[string]string
}

func (e *reasoned) Error() string { return e.err.Error() }
func (e *reasoned) Unwrap() error { return e.err }

// WithReason returns err (its message, its sentinels) with the reason and
// metadata of its status's ErrorInfo detail: ToGRPC sends the outermost
// reason err carries. A nil err stays nil.
func WithReason(err error, reason string, metadata map[string]string) error {
	if err == nil {
		return nil
	}
	return &reasoned{err: err, reason: reason, metadata: metadata}
}

// InfoOf returns the ErrorInfo detail in Domain of a gRPC status error: ok
// is false for an error that is not a status, or a status no nodeplug
// service made (a transport failure, another server's answer).
func InfoOf(err error) (*errdetails.ErrorInfo, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return nil, false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == Domain {
			return info, true
		}
	}
	return nil, false
}

// withInfo adds err's ErrorInfo to st: its reason when it carries one (see
// WithReason), else the code's name. A status whose strings are not UTF-8
// cannot carry details (they travel marshaled) and is returned as it is.
func withInfo(st *status.Status, err error) *status.Status {
	info := &errdetails.ErrorInfo{Domain: Domain, Reason: reasonOf(st.Code())}
	var r *reasoned
	if errors.As(err, &r) {
		info.Reason, info.Metadata = r.reason, r.metadata
	}
	if !utf8.ValidString(st.Message()) {
		return st
	}
	// WithDetails marshals info: metadata that is not UTF-8 fails it.
	out, derr := st.WithDetails(info)
	if derr != nil {
		return st
	}
	return out
}

// reasonOf is a code's name in upper snake case ("FAILED_PRECONDITION").
func reasonOf(c codes.Code) string {
	var b strings.Builder
	for i, r := range c.String() {
		if i > 0 && unicode.IsUpper(r) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToUpper(r))
	}
	return b.String()
}
