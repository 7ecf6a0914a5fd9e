{{/* Names: <release>-knotless unless the release name holds "knotless". */}}
{{- define "knotless.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "knotless.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/part-of: knotless
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ default .Chart.AppVersion .Values.image.tag | quote }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The namespace of every namespaced object: namespaceOverride or the release's. */}}
{{- define "knotless.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{/* selector labels of a component: (list . "provider") */}}
{{- define "knotless.selector" -}}
app.kubernetes.io/name: knotless-{{ index . 1 }}
app.kubernetes.io/instance: {{ (index . 0).Release.Name }}
{{- end -}}

{{- define "knotless.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "knotless.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* image of a component: (list . .Values.provider) */}}
{{- define "knotless.image" -}}
{{- $root := index . 0 -}}
{{- $c := index . 1 -}}
{{- $repo := $c.image.repository -}}
{{- with $root.Values.image.registry }}{{ $repo = printf "%s/%s" (trimSuffix "/" .) $repo }}{{ end -}}
{{- printf "%s:%s" $repo (default $root.Chart.AppVersion $root.Values.image.tag) -}}
{{- end -}}

{{/* The mount proxy's Service URL, or provider.mount.proxyURL. */}}
{{- define "knotless.mountProxyURL" -}}
{{- if .Values.provider.mount.proxyURL -}}
{{- .Values.provider.mount.proxyURL -}}
{{- else if .Values.mountproxy.enabled -}}
{{- printf "https://%s-mountproxy.%s.svc:%v" (include "knotless.fullname" .) (include "knotless.namespace" .) .Values.mountproxy.service.port -}}
{{- end -}}
{{- end -}}

{{/* The identity header names as environment variables from their Secret. */}}
{{- define "knotless.identityHeaderEnv" -}}
{{- $h := .Values.identityHeaders -}}
{{- $secret := include "knotless.identityHeadersSecret" . -}}
- name: KNOTLESS_USER_HEADER
  valueFrom:
    secretKeyRef: {name: {{ $secret | quote }}, key: {{ $h.userKey | quote }}}
- name: KNOTLESS_GROUP_HEADER
  valueFrom:
    secretKeyRef: {name: {{ $secret | quote }}, key: {{ $h.groupKey | quote }}}
- name: KNOTLESS_EXTRA_HEADER_PREFIX
  valueFrom:
    secretKeyRef: {name: {{ $secret | quote }}, key: {{ $h.extraPrefixKey | quote }}}
{{- end -}}

{{/* A Secret volume with one key mounted as path: (list name secret key path) */}}
{{- define "knotless.secretVolume" -}}
- name: {{ index . 0 }}
  secret:
    secretName: {{ index . 1 | quote }}
    defaultMode: 0440
    items:
      - key: {{ index . 2 | quote }}
        path: {{ index . 3 | quote }}
{{- end -}}

{{/* Probes on the health port. */}}
{{- define "knotless.probes" -}}
startupProbe:
  httpGet: {path: /healthz, port: health}
  periodSeconds: 5
  failureThreshold: 60
livenessProbe:
  httpGet: {path: /healthz, port: health}
  periodSeconds: 10
  failureThreshold: 3
readinessProbe:
  httpGet: {path: /readyz, port: health}
  periodSeconds: 5
  failureThreshold: 2
{{- end -}}


{{/*
The mount path's Secrets. With the mount proxy in this release, a Secret
the values do not name is made by the chart (templates/mountpath-secrets.yaml)
or by cert-manager (certManager.enabled): these helpers return its name.
Without the mount proxy in this release they must be named.
*/}}
{{- define "knotless.identityHeadersSecret" -}}
{{- if .Values.identityHeaders.secretName -}}
{{- .Values.identityHeaders.secretName -}}
{{- else if .Values.mountproxy.enabled -}}
{{- printf "%s-identity-headers" (include "knotless.fullname" .) -}}
{{- else -}}
{{- required "identityHeaders.secretName: a Secret with the mount path's identity header names (docs/install.md); the chart makes one only with mountproxy.enabled" "" -}}
{{- end -}}
{{- end -}}

{{/* The serving certificate: named, or made when mountproxy.servingCertSecret.name is empty. */}}
{{- define "knotless.servingSecret" -}}
{{- default (printf "%s-mountproxy-serving" (include "knotless.fullname" .)) .Values.mountproxy.servingCertSecret.name -}}
{{- end -}}

{{/* The CA of kcp-front-proxy's and the probe's client certificates: (list name key). */}}
{{- define "knotless.requestHeaderCA" -}}
{{- $m := .Values.mountproxy -}}
{{- if $m.requestHeaderCASecret.name -}}
{{- list $m.requestHeaderCASecret.name $m.requestHeaderCASecret.key | toJson -}}
{{- else if .Values.certManager.enabled -}}
{{- list (printf "%s-probe" (include "knotless.fullname" .)) "ca.crt" | toJson -}}
{{- else -}}
{{- list (printf "%s-requestheader-ca" (include "knotless.fullname" .)) "ca.crt" | toJson -}}
{{- end -}}
{{- end -}}

{{/* The CA the provider's probe verifies the mount proxy with: (list name key). */}}
{{- define "knotless.mountCA" -}}
{{- $p := .Values.provider.mount -}}
{{- if $p.caSecret.name -}}
{{- list $p.caSecret.name $p.caSecret.key | toJson -}}
{{- else if and .Values.mountproxy.enabled (not .Values.mountproxy.servingCertSecret.name) -}}
{{- list (include "knotless.servingSecret" .) "ca.crt" | toJson -}}
{{- else -}}
{{- required "provider.mount.caSecret.name: a Secret with the CA of the mount proxy's serving certificate" "" -}}
{{- end -}}
{{- end -}}

{{/* The probe's client certificate. */}}
{{- define "knotless.probeSecret" -}}
{{- $p := .Values.provider.mount -}}
{{- if $p.probeCertSecret.name -}}
{{- $p.probeCertSecret.name -}}
{{- else if and .Values.mountproxy.enabled (not .Values.mountproxy.requestHeaderCASecret.name) -}}
{{- printf "%s-probe" (include "knotless.fullname" .) -}}
{{- else -}}
{{- required "provider.mount.probeCertSecret.name: a kubernetes.io/tls Secret with the probe's client certificate (CN knotless-probe)" "" -}}
{{- end -}}
{{- end -}}

{{/*
A Secret's data for reuse on upgrade: (list namespace name keys...). The
existing Secret's data as YAML when it has every key, else {}. helm
template and helm install --dry-run (client) have no cluster: lookup
returns nothing there, so the Secret is made anew.
*/}}
{{- define "knotless.existingSecretData" -}}
{{- $s := lookup "v1" "Secret" (index . 0) (index . 1) -}}
{{- $data := dict -}}
{{- if $s }}{{ $data = default dict $s.data }}{{ end -}}
{{- $complete := true -}}
{{- range (slice . 2) }}{{ if not (hasKey $data .) }}{{ $complete = false }}{{ end }}{{ end -}}
{{- if $complete }}{{ toYaml $data }}{{ else }}{}{{ end -}}
{{- end -}}

{{/* env of a component: (list . $component) */}}
{{- define "knotless.extraEnv" -}}
{{- $root := index . 0 -}}
{{- with concat $root.Values.extraEnv ((index . 1).extraEnv) }}{{ toYaml . }}{{ end -}}
{{- end -}}

{{/* Deployment spec fields of a component: strategy, affinity (default:
preferred anti-affinity by host for 2 or more replicas), topology spread
(the component's labels when a constraint has no selector). (list . $c "name") */}}
{{- define "knotless.scheduling" -}}
{{- $root := index . 0 -}}
{{- $c := index . 1 -}}
{{- $sel := include "knotless.selector" (list $root (index . 2)) | fromYaml -}}
{{- if $c.affinity }}
affinity:
  {{- toYaml $c.affinity | nindent 2 }}
{{- else if ge (int $c.replicas) 2 }}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- toYaml $sel | nindent 14 }}
{{- end }}
{{- with $c.topologySpreadConstraints }}
topologySpreadConstraints:
{{- range . }}
  - {{- toYaml (merge (deepCopy .) (dict "labelSelector" (dict "matchLabels" $sel))) | nindent 4 }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The provider's GuestIdentityGrant webhook: its Service's name, the
URL kcp calls (provider.guests.webhook.url or the Service) and its
certificate's Secret (certSecret.name or the one the chart makes). */}}
{{- define "knotless.guestWebhookService" -}}
{{- printf "%s-provider-webhook" (include "knotless.fullname" .) -}}
{{- end -}}
{{- define "knotless.guestWebhookURL" -}}
{{- default (printf "https://%s.%s.svc:443" (include "knotless.guestWebhookService" .) (include "knotless.namespace" .)) .Values.provider.guests.webhook.url -}}
{{- end -}}
{{- define "knotless.guestWebhookSecret" -}}
{{- default (include "knotless.guestWebhookService" .) .Values.provider.guests.webhook.certSecret.name -}}
{{- end -}}
