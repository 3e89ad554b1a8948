// Package server is the gRPC adapter of nodeplug.reconciler.v1: a thin
// shell over the published status (status.Board) and the driver registry
// (handler.Drivers), converting their types to the API's. It decides
// nothing; errors are mapped to status codes by the server's interceptor.
package server

import (
	"context"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	reconcilerv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/handler"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/status"
)

// Server implements reconcilerv1.ReconcilerServiceServer.
type Server struct {
	reconcilerv1.UnimplementedReconcilerServiceServer
	status  *status.Board
	drivers *handler.Drivers
}

var _ reconcilerv1.ReconcilerServiceServer = (*Server)(nil)

// New returns the service over the statuses on board and drivers.
func New(board *status.Board, drivers *handler.Drivers) *Server {
	return &Server{status: board, drivers: drivers}
}

// Register adds the service to srv.
func (s *Server) Register(srv *grpc.Server) { reconcilerv1.RegisterReconcilerServiceServer(srv, s) }

// PluginToProto converts a status. Every string in it came from outside (a
// file name, a plugin's answer, an error that echoes them) and a proto
// string must be UTF-8, or the whole List or Watch response fails: paths
// are carried as bounds.PathText (the socket path's bytes in
// socket_path_bytes too), other text as bounds.Text.
func PluginToProto(p status.PluginStatus) *reconcilerv1.Plugin {
	out := &reconcilerv1.Plugin{
		SocketPath:        bounds.PathText(p.SocketPath),
		SocketPathBytes:   bounds.PathBytes(p.SocketPath),
		State:             stateToProto(p.State),
		Name:              bounds.Text(p.Name),
		Type:              bounds.Text(p.Type),
		Endpoint:          bounds.PathText(p.Endpoint),
		SupportedVersions: texts(p.Versions),
		Generation:        bounds.Text(p.Generation),
		LastError:         bounds.Text(p.LastError),
		LastTraceId:       p.LastTraceID,
		Failures:          uint32(p.Failures),
	}
	if !p.NextRetry.IsZero() && p.State == status.StateFailed {
		out.NextRetryTime = timestamppb.New(p.NextRetry)
	}
	if !p.LastTransition.IsZero() {
		out.LastTransitionTime = timestamppb.New(p.LastTransition)
	}
	return out
}

// texts returns vs as bounds.Text, vs itself when all are UTF-8.
func texts(vs []string) []string {
	for i, v := range vs {
		if bounds.Text(v) != v {
			out := slices.Clone(vs)
			for j := i; j < len(out); j++ {
				out[j] = bounds.Text(out[j])
			}
			return out
		}
	}
	return vs
}

func stateToProto(s status.State) reconcilerv1.PluginState {
	switch s {
	case status.StatePending:
		return reconcilerv1.PluginState_PLUGIN_STATE_PENDING
	case status.StateRegistered:
		return reconcilerv1.PluginState_PLUGIN_STATE_REGISTERED
	case status.StateFailed:
		return reconcilerv1.PluginState_PLUGIN_STATE_FAILED
	}
	return reconcilerv1.PluginState_PLUGIN_STATE_UNSPECIFIED
}

// ListPlugins returns every known socket.
func (s *Server) ListPlugins(context.Context, *reconcilerv1.ListPluginsRequest) (*reconcilerv1.ListPluginsResponse, error) {
	resp := &reconcilerv1.ListPluginsResponse{InstanceId: s.status.InstanceID()}
	for _, p := range s.status.List() {
		resp.Plugins = append(resp.Plugins, PluginToProto(p))
	}
	return resp, nil
}

// WatchPlugins streams the snapshot, a synced marker and every change,
// within the board's bounds (RESOURCE_EXHAUSTED past them).
func (s *Server) WatchPlugins(_ *reconcilerv1.WatchPluginsRequest, srv grpc.ServerStreamingServer[reconcilerv1.WatchPluginsResponse]) error {
	rev, sub, err := s.status.Watch()
	if err != nil {
		return err
	}
	id := s.status.InstanceID()
	send := func(c status.Change) error {
		t := reconcilerv1.PluginChangeType_PLUGIN_CHANGE_TYPE_UPDATED
		if c.Removed {
			t = reconcilerv1.PluginChangeType_PLUGIN_CHANGE_TYPE_REMOVED
		}
		return srv.Send(&reconcilerv1.WatchPluginsResponse{InstanceId: id, Item: &reconcilerv1.WatchPluginsResponse_Change{
			Change: &reconcilerv1.PluginChange{Type: t, Plugin: PluginToProto(c.Plugin), Revision: c.Revision},
		}})
	}
	synced := func() error {
		return srv.Send(&reconcilerv1.WatchPluginsResponse{InstanceId: id, Item: &reconcilerv1.WatchPluginsResponse_Synced{
			Synced: &reconcilerv1.Synced{Revision: rev},
		}})
	}
	return stream.Serve(srv.Context(), sub, send, synced)
}

// ListDrivers returns the CSI and DRA drivers.
func (s *Server) ListDrivers(context.Context, *reconcilerv1.ListDriversRequest) (*reconcilerv1.ListDriversResponse, error) {
	resp := &reconcilerv1.ListDriversResponse{}
	for _, d := range s.drivers.List(handler.TypeCSIPlugin) {
		resp.CsiDrivers = append(resp.CsiDrivers, &reconcilerv1.CSIDriver{
			Name:               d.Name,
			Endpoint:           bounds.PathText(d.Endpoint),
			SocketPath:         bounds.PathText(d.SocketPath),
			SupportedVersions:  d.Versions,
			HighestVersion:     d.CSI.HighestVersion,
			NodeId:             d.CSI.NodeID,
			AccessibleTopology: d.CSI.AccessibleTopology,
			MaxVolumesPerNode:  d.CSI.MaxVolumesPerNode,
			VendorVersion:      d.CSI.VendorVersion,
			RegisteredTime:     timestamppb.New(d.Registered),
		})
	}
	for _, d := range s.drivers.List(handler.TypeDRAPlugin) {
		resp.DraDrivers = append(resp.DraDrivers, &reconcilerv1.DRADriver{
			Name:              d.Name,
			Endpoint:          bounds.PathText(d.Endpoint),
			SocketPath:        bounds.PathText(d.SocketPath),
			SupportedVersions: d.Versions,
			RegisteredTime:    timestamppb.New(d.Registered),
		})
	}
	return resp, nil
}
