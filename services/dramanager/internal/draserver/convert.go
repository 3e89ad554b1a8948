package draserver

import (
	"encoding/json"
	"slices"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	resourcev1 "k8s.io/api/resource/v1"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/drivers"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/slicewatch"
)

func registrationFromAPI(req *dmv1.RegisterDRADriverRequest) (drivers.Registration, error) {
	endpoint, err := bounds.PathFromWire(req.GetEndpoint(), req.GetEndpointBytes())
	if err != nil {
		return drivers.Registration{}, err
	}
	socket, err := bounds.PathFromWire(req.GetSocketPath(), req.GetSocketPathBytes())
	if err != nil {
		return drivers.Registration{}, err
	}
	return drivers.Registration{
		Driver: req.GetDriverName(), Endpoint: endpoint, Services: slices.Clone(req.GetServices()),
		SocketPath: socket, Generation: req.GetGeneration(),
	}, nil
}

func timestamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func instanceToAPI(in drivers.Instance) *dmv1.DRADriverInstance {
	return &dmv1.DRADriverInstance{
		DriverName:        in.Driver,
		Endpoint:          bounds.PathText(in.Endpoint),
		EndpointBytes:     bounds.PathBytes(in.Endpoint),
		SocketPath:        bounds.PathText(in.SocketPath),
		SocketPathBytes:   bounds.PathBytes(in.SocketPath),
		Generation:        bounds.Text(in.Generation),
		OfferedServices:   textAll(in.OfferedServices),
		Service:           in.Service,
		Connected:         in.Connected,
		ConnectionState:   in.State.String(),
		Serving:           in.Serving,
		HealthService:     in.HealthService != "",
		HealthServiceName: in.HealthService,
		RegisteredTime:    timestamp(in.Registered),
		StateChangeTime:   timestamp(in.StateChange),
		LastError:         bounds.Text(in.LastError),
	}
}

func textAll(in []string) []string {
	out := make([]string, len(in))
	for i, s := range in {
		out[i] = bounds.Text(s)
	}
	return out
}

func driverToAPI(d drivers.Driver) *dmv1.DRADriver {
	out := &dmv1.DRADriver{Name: d.Name, SliceDeletionTime: timestamp(d.SliceDeletion)}
	for _, in := range d.Instances {
		out.Instances = append(out.Instances, instanceToAPI(in))
	}
	return out
}

// sliceToAPI converts a slice as the API served it; json is the object
// encoded again with its apiVersion and kind (a typed client drops them).
func sliceToAPI(s *resourcev1.ResourceSlice) *dmv1.ResourceSlice {
	out := &dmv1.ResourceSlice{
		Name:            s.Name,
		Uid:             string(s.UID),
		Driver:          s.Spec.Driver,
		Pool:            &dmv1.ResourcePool{Name: s.Spec.Pool.Name, Generation: s.Spec.Pool.Generation, ResourceSliceCount: s.Spec.Pool.ResourceSliceCount},
		ResourceVersion: s.ResourceVersion,
	}
	if s.Spec.NodeName != nil {
		out.NodeName = *s.Spec.NodeName
	}
	out.CreationTime = timestamp(s.CreationTimestamp.Time)
	for i := range s.Spec.Devices {
		out.Devices = append(out.Devices, deviceToAPI(&s.Spec.Devices[i]))
	}
	c := s.DeepCopy()
	c.APIVersion, c.Kind = resourcev1.SchemeGroupVersion.String(), "ResourceSlice"
	if b, err := json.Marshal(c); err == nil {
		out.Json = string(b)
	}
	return out
}

func deviceToAPI(d *resourcev1.Device) *dmv1.Device {
	out := &dmv1.Device{Name: d.Name}
	if len(d.Attributes) > 0 {
		out.Attributes = make(map[string]string, len(d.Attributes))
		for k, v := range d.Attributes {
			out.Attributes[string(k)] = attributeText(v)
		}
	}
	if len(d.Capacity) > 0 {
		out.Capacity = make(map[string]string, len(d.Capacity))
		for k, v := range d.Capacity {
			out.Capacity[string(k)] = v.Value.String()
		}
	}
	return out
}

// attributeText is an attribute's value as a string: a string or version
// as written, an int in decimal, a bool as true or false.
func attributeText(a resourcev1.DeviceAttribute) string {
	switch {
	case a.StringValue != nil:
		return *a.StringValue
	case a.VersionValue != nil:
		return *a.VersionValue
	case a.IntValue != nil:
		return strconv.FormatInt(*a.IntValue, 10)
	case a.BoolValue != nil:
		return strconv.FormatBool(*a.BoolValue)
	}
	return ""
}

func changeTypeToAPI(t slicewatch.ChangeType) dmv1.ResourceSliceChangeType {
	if t == slicewatch.Removed {
		return dmv1.ResourceSliceChangeType_RESOURCE_SLICE_CHANGE_TYPE_REMOVED
	}
	return dmv1.ResourceSliceChangeType_RESOURCE_SLICE_CHANGE_TYPE_UPDATED
}
