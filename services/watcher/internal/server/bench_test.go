package server

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	watcherv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/watcher/v1"
	"github.com/nodeplug/nodeplug/services/watcher/internal/socketwatch"
)

// BenchmarkEventEncoding measures turning one live event into its wire form
// (API message and protobuf encoding), as every subscriber's send does.
func BenchmarkEventEncoding(b *testing.B) {
	ev := socketwatch.Event{
		Type: socketwatch.Created, Path: "/var/lib/kubelet/plugins_registry/example.com-gpu.sock",
		Generation: "fe00:984502:b1795991895507550264", Revision: 42, ObservedTime: time.Now(),
		TraceContext: map[string]string{"traceparent": "00-375d0ce2479dacf4ab08b8d432c7439e-078248a51ae035df-01"},
	}
	b.ReportAllocs()
	for range b.N {
		msg := &watcherv1.WatchSocketEventsResponse{InstanceId: "cf362846-b7de-41e4-8a4c-1a5f94b0f956",
			Item: &watcherv1.WatchSocketEventsResponse_Event{Event: EventToProto(ev)}}
		if _, err := proto.Marshal(msg); err != nil {
			b.Fatal(err)
		}
	}
}
