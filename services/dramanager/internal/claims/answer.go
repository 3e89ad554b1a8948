package claims

import (
	"fmt"
	"slices"
	"strings"

	resourcev1 "k8s.io/api/resource/v1"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/nodeplug/nodeplug/pkg/bounds"
)

// The bounds of a driver's answer that the claim's allocation does not
// fix already.
const (
	// maxCDIIDs bounds the CDI device IDs of one device.
	maxCDIIDs = 32
	// maxCDIIDLength bounds one CDI device ID: a vendor (a DNS
	// subdomain, 253 bytes), a class (a DNS label, 63) and a device name
	// (253), with their separators.
	maxCDIIDLength = 253 + 1 + 63 + 1 + 253
)

// checkAnswer is driver's answer for the claim ref in res, the results of
// its NodePrepareResources (ok is false when it has none). Nothing a
// driver says is taken on trust: an answer that does not hold (see
// checkDevices) becomes the driver's error for the claim, which fails its
// prepare and rolls it back as any error of the driver does.
func checkAnswer(driver string, fresh []*resourcev1.ResourceClaim, ref ClaimRef, res map[string]PrepareResult) (PrepareResult, bool) {
	r, ok := res[ref.UID]
	if !ok || r.Err != nil {
		return r, ok
	}
	i := slices.IndexFunc(fresh, func(o *resourcev1.ResourceClaim) bool { return string(o.UID) == ref.UID })
	if i < 0 {
		return PrepareResult{Err: fmt.Errorf("DRA driver %s answered for ResourceClaim %s/%s (UID %s), which was not asked", bounds.Text(driver), ref.Namespace, ref.Name, ref.UID)}, true
	}
	if err := checkDevices(driver, fresh[i], r.Devices); err != nil {
		return PrepareResult{Err: fmt.Errorf("DRA driver %s answered NodePrepareResources for ResourceClaim %s/%s (UID %s) with %w",
			bounds.Text(driver), ref.Namespace, ref.Name, ref.UID, err)}, true
	}
	return r, true
}

// checkDevices checks a driver's devices for claim: each is a device the
// allocation gives to driver (by pool and name, at most as many times as
// it is allocated), names only requests the allocation gives it for (a
// request, or the request of a subrequest), and has at most maxCDIIDs CDI
// device IDs, each a qualified CDI name (vendor/class=name) as the CDI
// library parses it. The error quotes the field.
func checkDevices(driver string, claim *resourcev1.ResourceClaim, devs []Device) error {
	allocated := map[string][]string{} // "pool/device" → requests
	var n int
	if claim.Status.Allocation != nil {
		for _, r := range claim.Status.Allocation.Devices.Results {
			if r.Driver == driver {
				k := r.Pool + "/" + r.Device
				allocated[k] = append(allocated[k], r.Request)
				n++
			}
		}
	}
	if len(devs) > n {
		return fmt.Errorf("%d devices, but its allocation gives the driver %d", len(devs), n)
	}
	seen := map[string]int{}
	for i, d := range devs {
		field := fmt.Sprintf("devices[%d]", i)
		k := d.Pool + "/" + d.Device
		requests, ok := allocated[k]
		switch {
		case d.Driver != driver:
			return fmt.Errorf("%s is a device of driver %s", field, bounds.Quote(d.Driver))
		case !ok:
			return fmt.Errorf("%s: pool %s, device %s, which its allocation does not give the driver", field, bounds.Quote(d.Pool), bounds.Quote(d.Device))
		}
		if seen[k]++; seen[k] > len(requests) {
			return fmt.Errorf("%s: pool %s, device %s once more than its allocation gives it (%d)", field, bounds.Quote(d.Pool), bounds.Quote(d.Device), len(requests))
		}
		if err := checkRequests(field, d.Requests, requests); err != nil {
			return err
		}
		if err := checkCDIIDs(field, d.CDIDeviceIDs); err != nil {
			return err
		}
	}
	return nil
}

// checkRequests: each of a device's request names is one of allocated
// (the requests its allocation results name) or the request of such a
// subrequest ("<request>" for "<request>/<subrequest>"), and none twice.
// None at all is valid: the device serves the whole claim.
func checkRequests(field string, names, allocated []string) error {
	for j, name := range names {
		ok := slices.ContainsFunc(allocated, func(a string) bool {
			parent, _, _ := strings.Cut(a, "/")
			return name == a || name == parent
		})
		switch {
		case !ok:
			return fmt.Errorf("%s.requestNames[%d] %s, not a request the allocation gives this device for (%s)",
				field, j, bounds.Quote(name), strings.Join(allocated, ", "))
		case slices.Contains(names[:j], name):
			return fmt.Errorf("%s.requestNames[%d] %s twice", field, j, bounds.Quote(name))
		}
	}
	return nil
}

// checkCDIIDs: at most maxCDIIDs IDs, each at most maxCDIIDLength bytes
// and a qualified CDI device name.
func checkCDIIDs(field string, ids []string) error {
	if len(ids) > maxCDIIDs {
		return fmt.Errorf("%s: %d CDI device IDs, more than %d", field, len(ids), maxCDIIDs)
	}
	for j, id := range ids {
		f := fmt.Sprintf("%s.cdiDeviceIDs[%d]", field, j)
		if len(id) > maxCDIIDLength {
			return fmt.Errorf("%s %s: %d bytes, more than %d", f, bounds.Quote(id), len(id), maxCDIIDLength)
		}
		if _, _, _, err := parser.ParseQualifiedName(id); err != nil {
			return fmt.Errorf("%s %s: not a qualified CDI device name (vendor/class=name): %v", f, bounds.Quote(id), err)
		}
	}
	return nil
}
