package state

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
)

// DRA is the name Snapshot.Status gives nodeplug-dramanager (its
// DRAService: the ResourceSlice stream, the driver and claim lists).
const DRA = "dramanager"

// draPoll is how often the driver and claim lists are fetched when nothing
// asked for them: no stream carries a DRA driver's connection state or a
// claim's, so a change that no plugin or slice change accompanies shows
// within this time.
const draPoll = 5 * time.Second

// watchSlices follows WatchResourceSlices as the other watches follow
// theirs: the opening snapshot replaces the map at the synced marker, then
// each change applies. Every change also asks for new driver and claim
// lists, since a slice change often comes with a driver's (registration,
// removal after the deletion delay).
func (s *State) watchSlices(ctx context.Context) error {
	st, err := dmv1.NewDRAServiceClient(s.conns.DRAManager).WatchResourceSlices(ctx, &dmv1.WatchResourceSlicesRequest{})
	if err != nil {
		s.setStatus(DRA, describe(err))
		return err
	}
	snap := map[string]*dmv1.ResourceSlice{}
	synced := false
	for {
		resp, err := st.Recv()
		if err != nil {
			s.setStatus(DRA, describe(err))
			return err
		}
		if resp.GetSynced() != nil {
			synced = true
			s.update(func() { s.slices, s.status[DRA] = snap, "" })
			s.synced(DRA, len(snap))
			s.refreshDRA()
			continue
		}
		ch := resp.GetChange()
		if ch == nil || ch.GetSlice() == nil {
			continue
		}
		apply := func(m map[string]*dmv1.ResourceSlice) {
			if ch.GetType() == dmv1.ResourceSliceChangeType_RESOURCE_SLICE_CHANGE_TYPE_REMOVED {
				delete(m, ch.GetSlice().GetName())
			} else {
				m[ch.GetSlice().GetName()] = ch.GetSlice()
			}
		}
		if !synced {
			apply(snap)
			continue
		}
		s.update(func() { apply(s.slices) })
		s.refreshDRA()
	}
}

// refreshDRA asks for new driver and claim lists; requests that arrive
// while they are fetched fold into the next.
func (s *State) refreshDRA() {
	select {
	case s.dra <- struct{}{}:
	default:
	}
}

// listDRA fetches ListDRADrivers and ListClaims whenever asked (a plugin
// change, a slice change, a stream's sync) and every draPoll.
func (s *State) listDRA(ctx context.Context) {
	client := dmv1.NewDRAServiceClient(s.conns.DRAManager)
	tick := time.NewTicker(draPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.dra:
		case <-tick.C:
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		drivers, derr := client.ListDRADrivers(cctx, &dmv1.ListDRADriversRequest{})
		claims, cerr := client.ListClaims(cctx, &dmv1.ListClaimsRequest{})
		cancel()
		if ctx.Err() != nil {
			return
		}
		s.mu.Lock()
		nd, nc, dp, cp := s.drivers, s.claims, s.driversProblem, s.claimsProblem
		s.mu.Unlock()
		if derr != nil {
			dp = "listing DRA drivers: " + describe(derr)
		} else {
			nd, dp = sortedDrivers(drivers.GetDrivers()), ""
		}
		switch {
		case status.Code(cerr) == codes.Unimplemented:
			nc, cp = nil, "this devicemanager does not serve ListClaims"
		case cerr != nil:
			cp = "listing claims: " + describe(cerr)
		default:
			nc, cp = sortedClaims(claims.GetClaims()), ""
		}
		// Most polls find nothing new: wake the views only for a change,
		// so that an open page is not redrawn every draPoll.
		s.mu.Lock()
		same := dp == s.driversProblem && cp == s.claimsProblem && equalMessages(nd, s.drivers) && equalMessages(nc, s.claims)
		s.mu.Unlock()
		if !same {
			s.update(func() { s.drivers, s.claims, s.driversProblem, s.claimsProblem = nd, nc, dp, cp })
		}
	}
}

func equalMessages[M proto.Message](a, b []M) bool {
	return slices.EqualFunc(a, b, func(x, y M) bool { return proto.Equal(x, y) })
}

func sortedDrivers(in []*dmv1.DRADriver) []*dmv1.DRADriver {
	out := slices.Clone(in)
	slices.SortFunc(out, func(a, b *dmv1.DRADriver) int { return strings.Compare(a.GetName(), b.GetName()) })
	return out
}

func sortedClaims(in []*dmv1.Claim) []*dmv1.Claim {
	out := slices.Clone(in)
	slices.SortFunc(out, func(a, b *dmv1.Claim) int {
		return cmp.Or(strings.Compare(a.GetNamespace(), b.GetNamespace()), strings.Compare(a.GetName(), b.GetName()),
			strings.Compare(a.GetUid(), b.GetUid()))
	})
	return out
}
