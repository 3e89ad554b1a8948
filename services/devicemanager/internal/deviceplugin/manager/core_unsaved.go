// This file holds the devices whose release is not durable yet. A
// Release, or the rollback of an Allocate whose save failed, removes
// allocations from memory at once, but their devices stay taken until a
// write that holds the removal has succeeded: until then the disk may
// still say they are held (a failed write may have reached it, or not),
// and memory never calls a device free that the disk may give to a pod
// after a restart. A Release whose save failed is taken back (unrelease)
// while its devices are still held.

package manager

import "slices"

// freeing is devices of one allocation removed from memory, taken until
// that removal is durable.
type freeing struct {
	key allocKey
	ids []string
	// stage is the count of stagings (core.stages) when the removal was
	// marked: the next staging holds it, so a write of a later stage that
	// succeeds has made it durable.
	stage uint64
}

// freeLaterLocked keeps ids taken by k until its removal, marked now, is
// durable.
func (c *core) freeLaterLocked(k allocKey, ids []string) *freeing {
	f := &freeing{key: k, ids: ids, stage: c.stages}
	c.freeing = append(c.freeing, f)
	return f
}

// cancelFreeLocked takes fs out of the devices to free, and reports
// whether they were all still there (not durable yet). It changes nothing
// when they were not.
func (c *core) cancelFreeLocked(fs []*freeing) bool {
	for _, f := range fs {
		if !containsPtr(c.freeing, f) {
			return false
		}
	}
	c.freeing = slices.DeleteFunc(c.freeing, func(f *freeing) bool { return containsPtr(fs, f) })
	return true
}

// settle frees the devices whose removal a write of stage (now durable)
// held, and publishes the resources whose free devices changed.
func (c *core) settle(stage uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.freeing) == 0 {
		return
	}
	var resources []string
	c.freeing = slices.DeleteFunc(c.freeing, func(f *freeing) bool {
		if f.stage >= stage {
			return false
		}
		c.ledger.unreserve(f.key, f.ids)
		resources = append(resources, f.key.resource)
		return true
	})
	if len(resources) > 0 {
		c.allocationsChangedLocked(resources)
	}
}

func containsPtr(fs []*freeing, f *freeing) bool {
	for _, g := range fs {
		if g == f {
			return true
		}
	}
	return false
}
