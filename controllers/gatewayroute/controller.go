// Package gatewayroute is knotless-agent's controller of its gateway's
// routes (issue 32, the bidder's half): for every ComputeVM of a live
// lease of its own whose tenant runs pods, it follows the
// dev.knotless.gateway.association records of the lease's requester, in
// the requester's own repo (its PDS, commits verified), and routes each
// hostname a record claims for that lease to the record's Service in the
// tenant. Nothing else is served: a record from anyone but the lease's
// requester, one naming another lease, a lease that ended, a hostname
// the gateway's certificate does not cover or whose record key is not
// the hostname. The routes live in the agent's memory only; it writes
// nothing to kcp.
package gatewayroute

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
	"github.com/knotless-dev/knotless/internal/driver"
	"github.com/knotless-dev/knotless/internal/gateway"
	"github.com/knotless-dev/knotless/internal/lexicon"
	"github.com/knotless-dev/knotless/internal/sshgateway"
)

// Name is the controller's name.
const Name = "gatewayroute"

// retry is when a VM whose requester's records cannot be followed yet
// (its DID does not resolve, its PDS is not reached) is looked at again.
const retry = 30 * time.Second

// Records follows the association records of requesters' repos.
type Records interface {
	// Follow makes sure did's records are followed for vm (a VM follows
	// one DID at a time); changes wake vm up through Wake.
	Follow(ctx context.Context, vm types.NamespacedName, did string) error
	// Unfollow: vm follows nothing.
	Unfollow(vm types.NamespacedName)
	// Records are did's association records as last read: at-URI →
	// record JSON. listed is false until its repo was read once.
	Records(did string) (records map[string]json.RawMessage, listed bool)
}

// Reconciler keeps the routes of the ComputeVMs of the agent's workspace.
type Reconciler struct {
	Client client.Client
	// Drivers by name (the VM's spec.driver); only a driver.Workloads
	// driver's VMs are routed to.
	Drivers map[string]driver.Driver
	Records Records
	Routes  *gateway.Routes
	// SSH, when set, receives the namespaces each VM's requester lets
	// SSH sessions into (dev.knotless.gateway.ssh records).
	SSH *sshgateway.Targets
	// Covers says whether the gateway's certificate covers a hostname.
	Covers func(hostname string) bool
	// Wake receives the VMs whose requester's records changed.
	Wake <-chan event.TypedGenericEvent[*computev1alpha1.ComputeVM]

	mu sync.Mutex
	// uids are the VMs with routes, by name (a deleted VM is known by
	// name only).
	uids map[types.NamespacedName]types.UID
}

// SetupWithManager registers the controller: it looks at a VM when the
// VM, its contract or its requester's records change.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	b := ctrl.NewControllerManagedBy(mgr).
		Named(Name).
		For(&computev1alpha1.ComputeVM{}).
		Watches(&marketv1alpha1.ComputeContract{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			// A contract's VM has the contract's name.
			return []reconcile.Request{{NamespacedName: client.ObjectKeyFromObject(o)}}
		})).
		WithOptions(controller.Options{
			RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](time.Second, time.Minute),
		})
	if r.Wake != nil {
		b = b.WatchesRawSource(source.Channel(r.Wake, &handler.TypedEnqueueRequestForObject[*computev1alpha1.ComputeVM]{}))
	}
	return b.Complete(r)
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	vm := &computev1alpha1.ComputeVM{}
	if err := r.Client.Get(ctx, req.NamespacedName, vm); err != nil {
		if apierrors.IsNotFound(err) {
			r.drop(req.NamespacedName)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	cc, err := r.liveContract(ctx, vm)
	if err != nil || cc == nil {
		r.drop(req.NamespacedName)
		return reconcile.Result{}, err
	}
	did := cc.Spec.RequesterDID
	if err := r.Records.Follow(ctx, req.NamespacedName, did); err != nil {
		log.FromContext(ctx).Info("the requester's gateway records cannot be followed yet", "did", did, "error", err.Error())
		r.set(req.NamespacedName, vm.UID, nil)
		if r.SSH != nil {
			r.SSH.Set(string(vm.UID), "", nil)
		}
		return reconcile.Result{RequeueAfter: retry}, nil
	}
	records, listed := r.Records.Records(did)
	if !listed {
		// The first listing wakes the VM up when it comes.
		return reconcile.Result{}, nil
	}
	routes := Routes(records, did, cc.Status.Records.Lease.URI, r.Covers)
	for i := range routes {
		routes[i].Rank = cc.CreationTimestamp.UnixNano()
	}
	r.set(req.NamespacedName, vm.UID, routes)
	if r.SSH != nil {
		l := cc.Status.Records.Lease.URI
		r.SSH.Set(string(vm.UID), l[strings.LastIndex(l, "/")+1:], SSHNamespaces(records, did, l))
	}
	return reconcile.Result{}, nil
}

// liveContract is the VM's bidder contract when the VM is one to route
// to: running, of a Workloads driver, controlled by an Active bidder
// ComputeContract with a lease. nil otherwise.
func (r *Reconciler) liveContract(ctx context.Context, vm *computev1alpha1.ComputeVM) (*marketv1alpha1.ComputeContract, error) {
	if _, ok := r.Drivers[vm.Spec.Driver].(driver.Workloads); !ok || !vm.DeletionTimestamp.IsZero() ||
		vm.Status.Phase != computev1alpha1.VMRunning || vm.Spec.ContractName == "" {
		return nil, nil
	}
	cc := &marketv1alpha1.ComputeContract{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: vm.Namespace, Name: vm.Spec.ContractName}, cc); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	if !metav1.IsControlledBy(vm, cc) || cc.Spec.Side != marketv1alpha1.SideBidder || cc.Status.Phase != marketv1alpha1.ContractActive ||
		cc.Status.Records.Lease == nil || cc.Status.Records.Lease.URI == "" || cc.Spec.RequesterDID == "" {
		return nil, nil
	}
	return cc, nil
}

// set replaces the routes of VM k (uid).
func (r *Reconciler) set(k types.NamespacedName, uid types.UID, routes []gateway.Route) {
	r.mu.Lock()
	if r.uids == nil {
		r.uids = map[types.NamespacedName]types.UID{}
	}
	old := r.uids[k]
	if old != "" && old != uid {
		r.Routes.Set(string(old), nil)
	}
	r.uids[k] = uid
	r.mu.Unlock()
	r.Routes.Set(string(uid), routes)
	if r.SSH != nil && old != "" && old != uid {
		r.SSH.Set(string(old), "", nil)
	}
}

// drop removes VM k's routes and stops following for it.
func (r *Reconciler) drop(k types.NamespacedName) {
	r.mu.Lock()
	uid, ok := r.uids[k]
	delete(r.uids, k)
	r.mu.Unlock()
	if ok {
		r.Routes.Set(string(uid), nil)
		if r.SSH != nil {
			r.SSH.Set(string(uid), "", nil)
		}
	}
	r.Records.Unfollow(k)
}

// association is the part of a dev.knotless.gateway.association record
// a route is made of (the lexicon checked the rest).
type association struct {
	Hostname string `json:"hostname"`
	Lease    struct {
		URI string `json:"uri"`
	} `json:"lease"`
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
		Port      int32  `json:"port"`
	} `json:"service"`
}

// Routes are the routes of did's association records for lease: a record
// counts only if it is in did's repo, names lease, is keyed by its
// hostname, and covers says the gateway serves that hostname.
func Routes(records map[string]json.RawMessage, did, lease string, covers func(string) bool) []gateway.Route {
	var out []gateway.Route
	prefix := "at://" + did + "/" + lexicon.GatewayAssociation + "/"
	for uri, raw := range records {
		rkey, ok := strings.CutPrefix(uri, prefix)
		if !ok {
			continue
		}
		var a association
		if json.Unmarshal(raw, &a) != nil || a.Lease.URI != lease || rkey != a.Hostname || !validHostname(a.Hostname) ||
			covers == nil || !covers(a.Hostname) || len(validation.IsDNS1123Label(a.Service.Namespace)) > 0 ||
			len(validation.IsDNS1035Label(a.Service.Name)) > 0 || a.Service.Port < 1 || a.Service.Port > 65535 {
			continue
		}
		out = append(out, gateway.Route{Hostname: a.Hostname, DID: did, Namespace: a.Service.Namespace,
			Service: a.Service.Name, Port: a.Service.Port})
	}
	return out
}

// validHostname: a lowercase DNS name of at least two labels, no port,
// no trailing dot, no wildcard.
func validHostname(h string) bool {
	return h == strings.ToLower(h) && strings.Contains(h, ".") && len(validation.IsDNS1123Subdomain(h)) == 0
}

// SSHNamespaces are the namespaces did's dev.knotless.gateway.ssh
// records let SSH sessions into for lease: a record counts only if it is
// in did's repo and names lease; a namespace that is not a DNS label is
// left out.
func SSHNamespaces(records map[string]json.RawMessage, did, lease string) []string {
	prefix := "at://" + did + "/" + lexicon.GatewaySSH + "/"
	seen := map[string]bool{}
	var out []string
	for uri, raw := range records {
		if !strings.HasPrefix(uri, prefix) {
			continue
		}
		var rec struct {
			Lease struct {
				URI string `json:"uri"`
			} `json:"lease"`
			Namespaces []string `json:"namespaces"`
		}
		if json.Unmarshal(raw, &rec) != nil || rec.Lease.URI != lease {
			continue
		}
		for _, ns := range rec.Namespaces {
			if len(validation.IsDNS1123Label(ns)) == 0 && !seen[ns] {
				seen[ns] = true
				out = append(out, ns)
			}
		}
	}
	slices.Sort(out)
	return out
}
