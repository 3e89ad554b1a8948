// Package errdefs defines nodeplug's error kinds and their mapping to gRPC
// status codes. Code wraps one of the sentinels with %w; the mapping happens
// once, at the gRPC boundary (ToGRPC and the server interceptor in rpcutil),
// and back on the client side (FromGRPC).
package errdefs

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Sentinel errors. Wrap them: fmt.Errorf("resource %q: %w", name, ErrNotFound).
var (
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrPermissionDenied: a party the service relies on (the Kubernetes
	// API) refused the service's own identity; the message names what
	// was refused and to whom.
	ErrPermissionDenied   = errors.New("permission denied")
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrUnavailable        = errors.New("unavailable")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrInternal           = errors.New("internal error")
	ErrDeadlineExceeded   = errors.New("deadline exceeded")
)

var mapping = []struct {
	err  error
	code codes.Code
}{
	// A refusal comes first: an error that wraps it and another kind
	// (an API call failed, so the service is unavailable) is a refusal.
	{ErrPermissionDenied, codes.PermissionDenied},
	{ErrInvalidArgument, codes.InvalidArgument},
	{ErrNotFound, codes.NotFound},
	{ErrAlreadyExists, codes.AlreadyExists},
	{ErrFailedPrecondition, codes.FailedPrecondition},
	{ErrUnavailable, codes.Unavailable},
	{ErrResourceExhausted, codes.ResourceExhausted},
	{ErrInternal, codes.Internal},
	{ErrDeadlineExceeded, codes.DeadlineExceeded},
}

// Code returns the gRPC code for err: the code of a gRPC status it carries,
// else the code of the first sentinel it wraps, else Unknown.
func Code(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	if s, ok := status.FromError(err); ok {
		return s.Code()
	}
	for _, m := range mapping {
		if errors.Is(err, m.err) {
			return m.code
		}
	}
	switch {
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	}
	return codes.Unknown
}

// ToGRPC converts err into a gRPC status error. Errors that already are
// statuses pass through unchanged; the message is err.Error(), and an
// ErrorInfo detail in Domain says that a nodeplug service answered (with
// the reason err carries, see WithReason).
func ToGRPC(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return withInfo(status.New(Code(err), err.Error()), err).Err()
}

// FromGRPC converts a gRPC status error into an error that wraps the matching
// sentinel, keeping the status message.
func FromGRPC(err error) error {
	if err == nil {
		return nil
	}
	s, ok := status.FromError(err)
	if !ok {
		return err
	}
	for _, m := range mapping {
		if m.code == s.Code() {
			return fmt.Errorf("%s: %w", s.Message(), m.err)
		}
	}
	return err
}
