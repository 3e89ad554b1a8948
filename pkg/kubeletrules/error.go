package kubeletrules

import (
	"errors"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// Error is a failure with two texts: Kubelet, what the kubelet would send
// the plugin for it, and Err, nodeplug's detailed error for its own API and
// logs, which wraps the errdefs sentinel that gives the gRPC code. Error
// and Unwrap are Err's, so errors.Is and errdefs.Code see the sentinel.
//
// It is the one carrier of the kubelet's words in nodeplug: the
// devicemanager returns it, Status puts it on the wire of RegisterPlugin,
// FromStatus reads it back in the reconciler, and Told gives what a plugin
// is told.
type Error struct {
	// Kubelet is the kubelet's message for this failure.
	Kubelet string
	// Err is nodeplug's detailed error; nil means Kubelet alone.
	Err error
}

// Wrap returns an *Error that tells the plugin kubelet and is err otherwise.
func Wrap(kubelet string, err error) *Error { return &Error{Kubelet: kubelet, Err: err} }

// New returns an *Error that tells the plugin kubelet and whose detailed
// error is detail (kubelet when empty) wrapping kind, an errdefs sentinel:
// its text is detail + ": " + kind.
func New(kubelet, detail string, kind error) *Error {
	if detail == "" {
		detail = kubelet
	}
	if kind == nil {
		return &Error{Kubelet: kubelet, Err: errors.New(detail)}
	}
	return &Error{Kubelet: kubelet, Err: &kindError{msg: detail, kind: kind}}
}

// Error returns the detailed error's text.
func (e *Error) Error() string {
	if e.Err == nil {
		return e.Kubelet
	}
	return e.Err.Error()
}

// Unwrap returns the detailed error.
func (e *Error) Unwrap() error { return e.Err }

// kindError is a message wrapping an errdefs sentinel, as
// fmt.Errorf("%s: %w", msg, kind) without its formatting.
type kindError struct {
	msg  string
	kind error
}

func (e *kindError) Error() string { return e.msg + ": " + e.kind.Error() }
func (e *kindError) Unwrap() error { return e.kind }

// Message returns the kubelet's words of the first *Error in err's chain.
func Message(err error) (string, bool) {
	var ke *Error
	if errors.As(err, &ke) {
		return ke.Kubelet, true
	}
	return "", false
}

// Told is what the kubelet would tell a plugin for err: the kubelet's words
// when err carries them (Message), else err's own text without its errdefs
// sentinel (Plain).
func Told(err error) string {
	if msg, ok := Message(err); ok {
		return msg
	}
	return Plain(err)
}

// sentinels are the errdefs sentinels whose text a message toward a plugin
// leaves out.
var sentinels = []error{
	errdefs.ErrInvalidArgument, errdefs.ErrNotFound, errdefs.ErrAlreadyExists, errdefs.ErrFailedPrecondition,
	errdefs.ErrUnavailable, errdefs.ErrResourceExhausted, errdefs.ErrInternal, errdefs.ErrDeadlineExceeded,
}

// Plain is err's text without the trailing ": <kind>" of the errdefs
// sentinels it wraps: the kubelet's messages have no such suffix.
func Plain(err error) string {
	msg := err.Error()
	for _, s := range sentinels {
		if errors.Is(err, s) {
			msg = strings.TrimSuffix(msg, ": "+s.Error())
		}
	}
	return msg
}

// The ErrorInfo detail that carries the kubelet's words across gRPC (the
// devicemanager's RegisterPlugin to the reconciler): this domain and
// reason, the message in metadata key ErrorInfoKey. The strings are wire
// format: changing one breaks a reconciler of the old release.
const (
	ErrorInfoDomain = "nodeplug.devicemanager.v1"
	ErrorInfoReason = "KUBELET_MESSAGE"
	ErrorInfoKey    = "message"
)

// Status returns err as a gRPC status of its code (errdefs.Code) and text,
// with the kubelet's words as an ErrorInfo detail when err carries them
// (Message); other errors are returned unchanged, for the server
// interceptor to map.
func Status(err error) error {
	msg, ok := Message(err)
	if !ok {
		return err
	}
	// The details travel as a marshaled google.rpc.Status, whose strings
	// must be UTF-8: a message echoing a plugin's bytes would lose them.
	st, derr := status.New(errdefs.Code(err), bounds.Text(err.Error())).WithDetails(&errdetails.ErrorInfo{
		Domain: ErrorInfoDomain, Reason: ErrorInfoReason,
		Metadata: map[string]string{ErrorInfoKey: bounds.Text(msg)},
	})
	if derr != nil {
		return err
	}
	return st.Err()
}

// FromStatus returns the kubelet's words that a gRPC error carries as the
// ErrorInfo detail of Status.
func FromStatus(err error) (string, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return "", false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorInfoDomain && info.GetReason() == ErrorInfoReason {
			if msg, ok := info.GetMetadata()[ErrorInfoKey]; ok {
				return msg, true
			}
		}
	}
	return "", false
}
