package gateway

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

func TestReadyEndpoints(t *testing.T) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "shop"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
		{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP},
		{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
	}}}
	pod := func(name string, ready *bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{"10.244.0.9"}, Conditions: discoveryv1.EndpointConditions{Ready: ready},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "web", Name: name}}
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "shop-x", Labels: map[string]string{discoveryv1.LabelServiceName: "shop"}},
		Ports:      []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}, {Name: ptr.To("other"), Port: ptr.To[int32](9)}},
		Endpoints: []discoveryv1.Endpoint{
			pod("shop-1", ptr.To(true)), pod("shop-2", nil), pod("shop-3", ptr.To(false)),
			{Addresses: []string{"10.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}, // no pod: not dialled
		},
	}
	cs := fake.NewClientset(svc, slice)
	eps, err := ReadyEndpoints(t.Context(), cs, "web", "shop", 80)
	if err != nil {
		t.Fatal(err)
	}
	want := []Endpoint{{"web", "shop-1", 8080}, {"web", "shop-2", 8080}}
	if len(eps) != 2 || eps[0] != want[0] || eps[1] != want[1] {
		t.Fatalf("endpoints %v, want %v", eps, want)
	}
	for _, tc := range []struct {
		name   string
		port   int32
		reason string
	}{
		{"nothing", 80, ReasonServiceNotFound},
		{"shop", 81, ReasonPortNotFound},
		{"shop", 53, ReasonPortNotFound}, // UDP is not forwarded
	} {
		_, err := ReadyEndpoints(t.Context(), cs, "web", tc.name, tc.port)
		var none *NoEndpoints
		if !errors.As(err, &none) || none.Reason != tc.reason {
			t.Errorf("%s:%d: %v, want %s", tc.name, tc.port, err, tc.reason)
		}
	}
	// Only pods that are not ready.
	slice.Endpoints = []discoveryv1.Endpoint{pod("shop-3", ptr.To(false))}
	cs = fake.NewClientset(svc, slice)
	var none *NoEndpoints
	if _, err := ReadyEndpoints(t.Context(), cs, "web", "shop", 80); !errors.As(err, &none) || none.Reason != ReasonNoReadyEndpoint {
		t.Fatalf("no ready pod: %v", err)
	}
}
