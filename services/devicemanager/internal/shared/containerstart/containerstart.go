// Package containerstart answers a container's start, as a kubelet does
// before it asks its runtime to start a container: the device plugins
// whose options ask for it are told with PreStartContainer (package
// manager), and the answer is what a container runtime needs to start the
// container with its devices: the qualified CDI device names to inject,
// every one resolved in the CDI spec directories first (package cdispec),
// and the device plugins' edits merged, for runtimes without CDI.
//
// The CDI names are, in this order: nodeplug's own device for the device
// plugins' envs, mounts and device nodes (nodeplug.io/container=NAME), the
// device plugins' cdi_devices, and the CDI device IDs of the DRA claims
// the container references (nodeplug-dramanager's, through package
// draclient). A name that does not resolve
// fails the start before any plugin is told of it: plugins and drivers
// that name CDI devices they never wrote would otherwise fail only inside
// the runtime, or not at all.
package containerstart

import (
	"context"
	"fmt"
	"slices"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/manager"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/shared/cdispec"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/shared/draclient"
)

// Devices is the device-plugin part of a start (manager.Manager).
type Devices interface {
	StartContainer(ctx context.Context, pod, container string, check func(manager.ContainerStart) error) (manager.ContainerStart, error)
}

// Claims gives the CDI device IDs of the DRA claims prepared for a
// container, and whether it references any (draclient.Client).
type Claims interface {
	Container(ctx context.Context, podUID, container string) ([]string, bool, error)
}

// Resolver resolves CDI names in the spec directories (cdispec.Specs).
type Resolver interface {
	Resolve(names []string) error
	SearchDirs() []string
}

var (
	_ Devices  = (*manager.Manager)(nil)
	_ Claims   = (*draclient.Client)(nil)
	_ Resolver = (*cdispec.Specs)(nil)
)

// Starter answers container starts.
type Starter struct {
	devices  Devices
	claims   Claims
	resolver Resolver
}

// New returns a Starter; claims may be nil (no DRA claims).
func New(devices Devices, c Claims, resolver Resolver) *Starter {
	return &Starter{devices: devices, claims: c, resolver: resolver}
}

// Result is what a container runtime needs to start a container with its
// devices.
type Result struct {
	// CDIDevices are the qualified CDI names to inject, each resolved.
	CDIDevices []string
	// Edits are the device plugins' edits merged, for runtimes without
	// CDI.
	Edits cdispec.Edits
	// SpecDirs are the directories the names were resolved in.
	SpecDirs []string
	// PreStarted are the resources whose plugins PreStartContainer was
	// called on.
	PreStarted []string
}

// Start answers a start of container of pod (see the package comment). A
// container with neither devices nor prepared claims is
// errdefs.ErrNotFound; a name that does not resolve
// errdefs.ErrFailedPrecondition naming it and the directories; a plugin's
// PreStartContainer failure is the plugin's error, and the allocation
// stays. When the claims cannot be read (the dramanager does not answer),
// the start fails with that error before any plugin is told.
func (s *Starter) Start(ctx context.Context, pod, container string) (Result, error) {
	var claimed []string
	var hasClaims bool
	if s.claims != nil {
		var err error
		if claimed, hasClaims, err = s.claims.Container(ctx, pod, container); err != nil {
			return Result{}, err
		}
	}
	var names []string
	check := func(d manager.ContainerStart) error {
		if len(d.Allocations) == 0 && !hasClaims {
			return fmt.Errorf("pod %s container %s has no devices allocated and no DRA claims prepared: %w", pod, container, errdefs.ErrNotFound)
		}
		if d.SpecDevice != "" {
			names = append(names, d.SpecDevice)
		}
		for _, n := range slices.Concat(d.CDIDevices, claimed) {
			if !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
		return s.resolver.Resolve(names)
	}
	d, err := s.devices.StartContainer(ctx, pod, container, check)
	if err != nil {
		return Result{}, err
	}
	return Result{
		CDIDevices: names, Edits: d.Edits, SpecDirs: s.resolver.SearchDirs(), PreStarted: d.PreStarted,
	}, nil
}
