package containers

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispecs "tags.cncf.io/container-device-interface/specs-go"
)

// cdiEdits are docker create's flags for a container's CDI devices.
type cdiEdits struct {
	devices, mounts, env, groups []string
}

// cdiArgs are the flags of the CDI devices names: their names as --device
// when the engine resolves them, else what their specs add (see Docker).
func (d *Docker) cdiArgs(names []string) (cdiEdits, error) {
	var e cdiEdits
	for _, n := range names {
		if _, _, _, err := parser.ParseQualifiedName(n); err != nil {
			return e, fmt.Errorf("CDI device %q is not a fully qualified name (vendor.com/class=name): %w", n, err)
		}
	}
	if len(names) == 0 {
		return e, nil
	}
	if d.engineCDI {
		for _, n := range names {
			e.devices = append(e.devices, "--device="+n)
		}
		return e, nil
	}
	edits, err := resolveCDI(d.cdiDirs, names)
	if err != nil {
		return e, err
	}
	return editFlags(edits)
}

// resolveCDI reads the spec directories, as a runtime does at each start
// (a spec written since the last start is seen), and returns the edits of
// the devices names: each spec's own edits once, then each device's, in
// the order of the names.
func resolveCDI(dirs, names []string) (cdispecs.ContainerEdits, error) {
	var all cdispecs.ContainerEdits
	// The errors of the spec files are kept by the cache (NewCache's is
	// always nil): they are told when a device is not found.
	cache, _ := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
	var unresolved []string
	var specs []*cdi.Spec
	var devs []*cdi.Device
	for _, n := range names {
		dev := cache.GetDevice(n)
		if dev == nil {
			unresolved = append(unresolved, n)
			continue
		}
		devs = append(devs, dev)
		if !slices.Contains(specs, dev.GetSpec()) {
			specs = append(specs, dev.GetSpec())
		}
	}
	if len(unresolved) > 0 {
		msg := fmt.Sprintf("unresolvable CDI devices %s in %s", strings.Join(unresolved, ", "), strings.Join(dirs, ", "))
		for path, errs := range cache.GetErrors() {
			for _, e := range errs {
				msg += fmt.Sprintf("; %s: %v", path, e)
			}
		}
		return all, fmt.Errorf("%s", msg)
	}
	add := func(e cdispecs.ContainerEdits, where string) error {
		switch {
		case len(e.Hooks) > 0:
			return fmt.Errorf("%s has OCI hooks: docker runs them only when the engine resolves CDI devices itself (Docker 25 and later, with CDI enabled)", where)
		case len(e.NetDevices) > 0:
			return fmt.Errorf("%s has network devices: docker adds them only when the engine resolves CDI devices itself", where)
		case e.IntelRdt != nil:
			return fmt.Errorf("%s sets Intel RDT: docker sets it only when the engine resolves CDI devices itself", where)
		}
		all.Env = append(all.Env, e.Env...)
		all.DeviceNodes = append(all.DeviceNodes, e.DeviceNodes...)
		all.Mounts = append(all.Mounts, e.Mounts...)
		all.AdditionalGIDs = append(all.AdditionalGIDs, e.AdditionalGIDs...)
		return nil
	}
	for _, s := range specs {
		if err := add(s.ContainerEdits, "CDI spec "+s.GetPath()); err != nil {
			return all, err
		}
	}
	for _, dev := range devs {
		if err := add(dev.ContainerEdits, "CDI device "+dev.GetQualifiedName()+" ("+dev.GetSpec().GetPath()+")"); err != nil {
			return all, err
		}
	}
	return all, nil
}

// editFlags are docker create's flags for the edits: the device nodes as
// --device, the mounts as bind mounts, the variables as --env, the
// groups as --group-add. A device node's type, numbers, mode and owner
// are the host's (docker reads them from the host path). Of a mount's
// options, ro (read-only) is kept; the others, bind kinds and propagation
// or nosuid and the like, are docker's own for bind mounts (rbind,
// rprivate). A mount of another type than bind is refused.
func editFlags(edits cdispecs.ContainerEdits) (cdiEdits, error) {
	var e cdiEdits
	for _, n := range edits.DeviceNodes {
		host := n.HostPath
		if host == "" {
			host = n.Path
		}
		a, err := deviceArg(host, n.Path, n.Permissions)
		if err != nil {
			return e, fmt.Errorf("CDI device node: %w", err)
		}
		e.devices = append(e.devices, a)
	}
	for _, m := range edits.Mounts {
		bind := m.Type == "" || m.Type == "bind" || m.Type == "none" && (slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind"))
		if !bind {
			return e, fmt.Errorf("CDI mount %s of type %q: docker is given bind mounts only", m.ContainerPath, m.Type)
		}
		a, err := mountArg(m.HostPath, m.ContainerPath, slices.Contains(m.Options, "ro"))
		if err != nil {
			return e, fmt.Errorf("CDI mount: %w", err)
		}
		e.mounts = append(e.mounts, a)
	}
	for _, v := range edits.Env {
		if k, _, ok := strings.Cut(v, "="); !ok || k == "" {
			return e, fmt.Errorf("CDI env %q is not KEY=VALUE", v)
		}
		e.env = append(e.env, "--env="+v)
	}
	for _, g := range edits.AdditionalGIDs {
		e.groups = append(e.groups, "--group-add="+strconv.FormatUint(uint64(g), 10))
	}
	return e, nil
}
