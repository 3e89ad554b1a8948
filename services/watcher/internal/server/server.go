// Package server is the gRPC adapter of nodeplug.watcher.v1.WatcherService
// over a socket watcher. It only converts between the watcher's types and
// the API's; the watching itself, and the meaning of every field, live in
// socketwatch. The watcher's errors pass through unchanged: the server's
// interceptor (pkg/rpcutil) maps them to status codes.
package server

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	watcherv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/watcher/v1"
	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/services/watcher/internal/socketwatch"
)

// Source is what the service needs from a socket watcher.
// *socketwatch.Watcher implements it.
type Source interface {
	InstanceID() string
	List() ([]socketwatch.Socket, uint64)
	Watch(ctx context.Context, send func(socketwatch.Event) error, synced func(socketwatch.Synced) error) error
}

var _ Source = (*socketwatch.Watcher)(nil)

// Server implements watcherv1.WatcherServiceServer.
type Server struct {
	watcherv1.UnimplementedWatcherServiceServer
	src Source
}

var _ watcherv1.WatcherServiceServer = (*Server)(nil)

// New returns a server over src.
func New(src Source) *Server { return &Server{src: src} }

// Register adds the service to srv.
func (s *Server) Register(srv *grpc.Server) { watcherv1.RegisterWatcherServiceServer(srv, s) }

// WatchSocketEvents implements watcherv1.WatcherServiceServer.
func (s *Server) WatchSocketEvents(_ *watcherv1.WatchSocketEventsRequest, stream watcherv1.WatcherService_WatchSocketEventsServer) error {
	id := s.src.InstanceID()
	return s.src.Watch(stream.Context(),
		func(ev socketwatch.Event) error {
			return stream.Send(&watcherv1.WatchSocketEventsResponse{
				InstanceId: id,
				Item:       &watcherv1.WatchSocketEventsResponse_Event{Event: EventToProto(ev)},
			})
		},
		func(sy socketwatch.Synced) error {
			return stream.Send(&watcherv1.WatchSocketEventsResponse{
				InstanceId: id,
				Item: &watcherv1.WatchSocketEventsResponse_Synced{Synced: &watcherv1.Synced{
					Revision:    sy.Revision,
					SocketCount: uint32(sy.SocketCount),
				}},
			})
		})
}

// ListSockets implements watcherv1.WatcherServiceServer.
func (s *Server) ListSockets(context.Context, *watcherv1.ListSocketsRequest) (*watcherv1.ListSocketsResponse, error) {
	socks, rev := s.src.List()
	return ListToProto(s.src.InstanceID(), socks, rev), nil
}

// ListToProto converts the socket set to its API form. A path that is not
// valid UTF-8 is carried quoted in path and as it is in path_bytes
// (bounds.PathText, bounds.PathBytes), so no file name fails the response.
func ListToProto(instanceID string, socks []socketwatch.Socket, rev uint64) *watcherv1.ListSocketsResponse {
	resp := &watcherv1.ListSocketsResponse{
		InstanceId: instanceID,
		Revision:   rev,
		Sockets:    make([]*watcherv1.Socket, 0, len(socks)),
	}
	for _, sk := range socks {
		resp.Sockets = append(resp.Sockets, &watcherv1.Socket{
			Path:         bounds.PathText(sk.Path),
			PathBytes:    bounds.PathBytes(sk.Path),
			Generation:   sk.Generation,
			ObservedTime: timestamppb.New(sk.ObservedTime),
		})
	}
	return resp
}

// EventToProto converts a watcher event to its API form; its path as in
// ListToProto.
func EventToProto(ev socketwatch.Event) *watcherv1.SocketEvent {
	typ := watcherv1.SocketEventType_SOCKET_EVENT_TYPE_UNSPECIFIED
	switch ev.Type {
	case socketwatch.Created:
		typ = watcherv1.SocketEventType_SOCKET_EVENT_TYPE_CREATED
	case socketwatch.Deleted:
		typ = watcherv1.SocketEventType_SOCKET_EVENT_TYPE_DELETED
	}
	return &watcherv1.SocketEvent{
		Type:         typ,
		Path:         bounds.PathText(ev.Path),
		PathBytes:    bounds.PathBytes(ev.Path),
		Generation:   ev.Generation,
		Revision:     ev.Revision,
		ObservedTime: timestamppb.New(ev.ObservedTime),
		Snapshot:     ev.Snapshot,
		TraceContext: ev.TraceContext,
	}
}
