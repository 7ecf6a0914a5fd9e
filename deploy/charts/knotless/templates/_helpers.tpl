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
{{- printf "https://%s-mountproxy.%s.svc:%v" (include "knotless.fullname" .) .Release.Namespace .Values.mountproxy.service.port -}}
{{- end -}}
{{- end -}}

{{/* The identity header names as environment variables from their Secret. */}}
{{- define "knotless.identityHeaderEnv" -}}
{{- $h := .Values.identityHeaders -}}
{{- $secret := required "identityHeaders.secretName: a Secret with the mount path's identity header names (docs/install.md)" $h.secretName -}}
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
