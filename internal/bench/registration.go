package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nodeplug/nodeplug/pkg/testplugin"
)

func (r *runner) registration(ctx context.Context, n int) (RegistrationResult, error) {
	r.logf("registration: %d device plugins at once", n)
	out := RegistrationResult{N: n}
	// The plugins listen in a staging directory first and are then renamed
	// into plugins_registry one after the other, so that N sockets appear
	// at once, as fast as the filesystem allows.
	staging := filepath.Join(r.root, fmt.Sprintf("staging-%d", n))
	if err := os.MkdirAll(staging, 0o750); err != nil {
		return out, err
	}
	defer os.RemoveAll(staging)
	plugins := make([]*devicePlugin, n)
	ready := make([]<-chan time.Time, n)
	for i := range plugins {
		dp, err := r.newStagedDevicePlugin(fmt.Sprintf("bench.example.com/r%d-%d", n, i), 1, staging)
		if err != nil {
			return out, err
		}
		if err := dp.Start(); err != nil {
			return out, err
		}
		plugins[i] = dp
		ready[i] = r.res.wait(dp.Resource(), allocatable(1))
	}
	cpu0 := r.cpuByService()
	for _, dp := range plugins {
		if err := dp.appear(); err != nil {
			return out, err
		}
	}
	out.AppearMs = ms(plugins[n-1].started.Sub(plugins[0].started))
	var notify, alloc []time.Duration
	var last time.Time
	for i, dp := range plugins {
		t, err := registeredAt(ctx, dp.Registration, dp.Resource()+" registered")
		if err != nil {
			return out, err
		}
		notify = append(notify, t.Sub(dp.started))
		if t.After(last) {
			last = t
		}
		ta, err := waitTime(ctx, ready[i], dp.Resource()+" allocatable")
		if err != nil {
			return out, err
		}
		alloc = append(alloc, ta.Sub(dp.started))
	}
	out.CPUms = map[string]float64{}
	for s, v := range r.cpuByService() {
		out.CPUms[s] = round2((v - cpu0[s]) * 1000)
	}
	out.Notify, out.Allocatable = NewDist(notify), NewDist(alloc)
	out.AllRegisteredMs = ms(last.Sub(plugins[0].started))

	gone := make([]<-chan time.Time, n)
	for i, dp := range plugins {
		gone[i] = r.plugs.wait(dp.final, nil)
	}
	// Remove the sockets, and stop the plugins' servers only once all are
	// deregistered: stopping 1,000 servers in this process would compete
	// for the two cores with the services being measured.
	removed := make([]time.Time, n)
	for i, dp := range plugins {
		removed[i] = time.Now()
		_ = os.Remove(dp.final)
	}
	var dereg []time.Duration
	for i := range plugins {
		t, err := waitTime(ctx, gone[i], plugins[i].final+" deregistered")
		if err != nil {
			return out, err
		}
		dereg = append(dereg, t.Sub(removed[i]))
	}
	for _, dp := range plugins {
		dp.Stop()
	}
	out.Deregistration = NewDist(dereg)
	r.logf("  notify %v\n  allocatable %v\n  all registered in %.1f ms (CPU ms %v)\n  deregistration %v", out.Notify, out.Allocatable, out.AllRegisteredMs, out.CPUms, out.Deregistration)
	return out, nil
}

// draPlugin starts a registration-only DRA plugin.
func (r *runner) draPlugin(prefix string) (*testplugin.Plugin, string, error) {
	name := fmt.Sprintf("%s-%d.bench.example.com", prefix, r.seq.Add(1))
	p, err := testplugin.Start(r.socket(prefix), testplugin.Info{Type: registerapi.DRAPlugin, Name: name, Versions: []string{"v1.DRAPlugin"}})
	return p, name, err
}
